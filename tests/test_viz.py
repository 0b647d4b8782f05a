"""ember.viz: the DOT picture of a lazy graph shows every op and one cluster per kernel that realize then runs."""

import re

import numpy as np

import ember as em


def _clusters(dot: str) -> list[str]:
    return re.findall(r"subgraph cluster_\d+ \{(.*?)\n  \}", dot, flags=re.S)


def test_each_kernel_is_a_cluster_and_every_op_a_node() -> None:
    x = em.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="c").realize()
    y = (x * 2 + 1).softmax(0)
    dot = em.viz.to_dot(y, title="softmax")
    assert dot.startswith('digraph "softmax" {') and dot.rstrip().endswith("}")
    with em.profile() as record:
        y.realize()
    clusters = _clusters(dot)
    assert len(clusters) == len(record.kernels) >= 2  # softmax over columns stores their maximum and sum
    labels = re.findall(r'label="([A-Z_]+)', dot)
    for op in ("BUFFER", "MUL", "ADD", "REDUCE_MAX", "EXP", "SUM"):  # (exp selects 0 below its limit: no MAX)
        assert op in labels, (op, labels)
    assert "(realized)" in dot and "3x4 float32" in dot
    names = set(re.findall(r"^\s+(n\d+) \[", dot, flags=re.M))
    edges = re.findall(r"^\s+(n\d+) -> (n\d+);", dot, flags=re.M)
    assert edges and all(source in names and target in names for source, target in edges)


def test_a_realized_tensor_is_one_box_and_save_writes_the_file(tmp_path) -> None:
    x = em.ones(2, 2, device="c").realize()
    dot = em.viz.to_dot(x)
    assert not _clusters(dot) and "shape=box" in dot and "->" not in dot
    path = em.viz.save(tmp_path / "graph.dot", x + 1)
    assert path.read_text().count("subgraph cluster_") == 1


def test_ember_viz_environment_writes_each_realize(tmp_path) -> None:
    from ember.context import overriding

    x = em.ones(3, device="c").realize()
    with overriding(viz_folder=str(tmp_path)):  # what EMBER_VIZ sets for every thread
        (x + 1).realize()
        (x * 3).sum().realize()
    files = sorted(tmp_path.glob("realize-*.dot"))
    assert len(files) == 2 and all(file.read_text().startswith("digraph") for file in files)
