"""The offline planner: a traced run (EMBER_TRACE) of an MLP training step and a jit capture, `python -m ember plan`,
and a fresh process with an empty disk cache loading the plan (EMBER_PLAN): same results as the traced run and as
torch, no kernelize, no compile; corrupt traces and plans give errors naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ember as em
from ember.plan.planner import PLAN_FILE, PlanError, PlanWarning, environment, load_plan, make_plan
from tests.conftest import TEST_DEVICES

ROOT = Path(__file__).resolve().parent.parent

# On each device given: three eager SGD steps of an MLP, then three calls of the same step under ember.jit (record,
# capture, replay). One process for every device, so that the test starts three processes in all.
SCRIPT = """
import json, sys
import numpy as np
import ember as em
from ember import nn, optim
from ember.plan.planner import PlanUse
from ember.scheduler.schedule import SCHEDULES

results = {}
with em.profile() as record:
    for device in sys.argv[1:]:
        em.set_default_device(device)
        rng = np.random.default_rng(0)
        model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
        initial = {name: parameter.numpy().tolist() for name, parameter in model.state_dict().items()}
        inputs = rng.standard_normal((5, 6)).astype(np.float32)
        labels = rng.integers(0, 3, 5)
        x, y = em.tensor(inputs), em.tensor(labels)
        optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return loss.realize()

        jitted = em.jit(step)
        losses = [step(x, y).item() for _ in range(3)] + [jitted(x, y).item() for _ in range(3)]
        results[device] = {"losses": losses, "initial": initial, "inputs": inputs.tolist(), "labels": labels.tolist(),
                           "final": {name: value.numpy().tolist() for name, value in model.state_dict().items()},
                           "arena_bytes": jitted.memory_plan[device].arena_bytes}
print(json.dumps({"results": results, "kernelized": SCHEDULES.misses, "planned": SCHEDULES.planned_hits,
                  "compiles": len(record.compiles), "arenas_from_plan": PlanUse.arenas}))
"""


def _run(arguments: list[str], environment_changes: dict[str, str]) -> str:
    environment_variables = {**os.environ, "PYTHONPATH": str(ROOT), **environment_changes}
    for name in ("EMBER_TRACE", "EMBER_PLAN"):
        if name not in environment_changes:
            environment_variables.pop(name, None)
    result = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, env=environment_variables,
                            cwd=ROOT, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _torch_run(found: dict) -> tuple[list[float], dict[str, np.ndarray]]:
    """The same six steps in torch from the same initial weights and data."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    model.load_state_dict({name: torch.tensor(value) for name, value in found["initial"].items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.tensor(found["inputs"]), torch.tensor(found["labels"])
    losses = []
    for _ in range(6):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: value.detach().numpy() for name, value in model.state_dict().items()}


def test_a_plan_runs_the_traced_steps_without_kernelizing_or_compiling(tmp_path: Path) -> None:
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    trace, plan = tmp_path / "trace.json", tmp_path / "step.plan"
    traced = json.loads(_run([str(script), *TEST_DEVICES], {"EMBER_TRACE": str(trace)}))
    assert traced["kernelized"] > 0 and traced["planned"] == 0
    printed = _run(["-m", "ember", "plan", str(trace), "-o", str(plan)], {})
    assert f"written to {plan}" in printed
    empty_cache = tmp_path / "empty-cache"
    loaded = json.loads(_run([str(script), *TEST_DEVICES], {"EMBER_PLAN": str(plan),
                                                            "EMBER_CACHE_DIR": str(empty_cache)}))
    document = json.loads(trace.read_text())

    assert loaded["kernelized"] == 0, "a graph of the trace was kernelized again"
    assert loaded["planned"] == traced["kernelized"]
    assert loaded["compiles"] == 0, "a kernel of the trace was compiled again"
    arena_devices = {arena["device"] for arena in document["jit_arenas"]}
    assert arena_devices == {device for device in TEST_DEVICES if not device.startswith("wgpu")}  # wgpu: no views
    assert loaded["arenas_from_plan"] == len(arena_devices)
    if any(device.startswith("c:") for device in TEST_DEVICES):  # no compiler ran: every library came from the plan
        assert {entry.name for entry in (empty_cache / "c").iterdir()} <= {
            entry.name for entry in (plan / "cache" / "c").iterdir()}
    for device in TEST_DEVICES:
        before, after = traced["results"][device], loaded["results"][device]
        assert after == before, f"{device}: the planned run differs from the traced one"
        torch_losses, torch_final = _torch_run(before)
        np.testing.assert_allclose(after["losses"], torch_losses, rtol=1e-4, atol=1e-5)
        for name, value in torch_final.items():
            np.testing.assert_allclose(np.array(after["final"][name]), value, rtol=1e-4, atol=1e-5)
    assert document["regions"] == [] and document["kernel_times"]
    assert all(times["runs"] > 0 and times["seconds"] > 0 for times in document["kernel_times"].values())


def test_corrupt_or_missing_traces_are_named(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"missing\.json: no such trace file"):
        make_plan(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "ember-trace", "vers')
    with pytest.raises(PlanError, match=r"broken\.json is not a valid trace: corrupt JSON"):
        make_plan(broken)
    broken.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(PlanError, match=r"broken\.json is not an ember trace \(its format is 'something-else'"):
        make_plan(broken)
    broken.write_text(json.dumps({"format": "ember-trace", "version": 1, "ember": "0.0.1", "source_digest": "00"}))
    with pytest.raises(PlanError, match=r"broken\.json: the trace was made by another ember"):
        make_plan(broken)
    schedule = {"signature": "ab", "items": [{"kernel": [0, [1], {"kernel": [[{"step": ["x"]}], []]}],
                                              "device": "c:0"}]}
    broken.write_text(json.dumps({"format": "ember-trace", "version": 1, **environment(), "schedules": [schedule]}))
    with pytest.raises(PlanError, match=r"broken\.json: schedule 0: a corrupt schedule"):
        make_plan(broken, tmp_path / "never")
    assert not (tmp_path / "never").exists()
    result = subprocess.run([sys.executable, "-m", "ember", "plan", str(tmp_path / "missing.json")], cwd=ROOT,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
                            check=False)
    assert result.returncode == 1 and "missing.json: no such trace file" in result.stderr


def _plan_document(**changes: object) -> dict:
    return {"format": "ember-plan", "version": 1, **environment(), "devices": {}, "schedules": {}, "jit_arenas": [],
            **changes}


def test_corrupt_foreign_and_partial_plans(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"plan\.json: no such plan file"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text("not json")
    with pytest.raises(PlanError, match=r"plan\.json is not a valid plan: corrupt JSON"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text(json.dumps(_plan_document(source_digest="1234", ember="0.0.1")))
    with pytest.raises(PlanError, match=r"made by another ember \(version '0.0.1'"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text(json.dumps(_plan_document(schedules={"ab": {"items": [{"copy": [0]}]}})))
    with pytest.raises(PlanError, match="schedule ab: a corrupt schedule"):
        load_plan(tmp_path / PLAN_FILE)
    overlapping = {"device": em.get_default_device(), "alignment": 64, "lifetimes": [[64, 0, 2], [64, 1, 3]],
                   "offsets": [0, 0], "arena_bytes": 64, "peak_bytes": 128}
    (tmp_path / PLAN_FILE).write_text(json.dumps(_plan_document(
        devices={em.get_default_device(): {"fingerprint": "x", "kernels": 0}}, jit_arenas=[overlapping])))
    with pytest.warns(PlanWarning, match="other capabilities"):  # the device differs: its entries are skipped
        loaded = load_plan(tmp_path)
    assert loaded.skipped_devices == [em.get_default_device()] and loaded.arenas == 0
    from ember.scheduler.devices import get_device
    from ember.plan.planner import device_fingerprint

    here = {em.get_default_device(): {"fingerprint": device_fingerprint(get_device(em.get_default_device())),
                                      "kernels": 0}}
    (tmp_path / PLAN_FILE).write_text(json.dumps(_plan_document(devices=here, jit_arenas=[overlapping])))
    with pytest.raises(PlanError, match="overlapping memory"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text(json.dumps(_plan_document(devices={"c:97": {"fingerprint": "x", "kernels": 1}})))
    with pytest.warns(PlanWarning, match="device c:97 is not available here"):
        assert load_plan(tmp_path).skipped_devices == ["c:97"]


def test_a_plan_never_replaces_a_folder_that_is_not_a_plan(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"format": "ember-trace", "version": 1, **environment(), "schedules": []}))
    (tmp_path / "work" / "notes.txt").parent.mkdir()
    (tmp_path / "work" / "notes.txt").write_text("mine")
    with pytest.raises(PlanError, match="exists and is not a plan folder"):
        make_plan(trace, tmp_path / "work")
    assert (tmp_path / "work" / "notes.txt").read_text() == "mine"


def test_record_trace_writes_schedules_kernel_times_and_regions(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    with em.record_trace(path):
        x = em.tensor(values)
        result = (x.exp() @ x.T).softmax(-1).numpy()
        (x.exp() @ x.T).softmax(-1).numpy()  # the same structure again: one schedule, run twice
        from ember.plan import trace

        trace.record_region("row", (3, 4), [(2, 3), (0, 4)])
        with pytest.raises(RuntimeError, match="already recording a trace"), em.record_trace(tmp_path / "other.json"):
            pass
    expected = torch.softmax(torch.exp(torch.tensor(values)) @ torch.tensor(values).T, -1).numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-5)
    document = json.loads(path.read_text())
    assert document["format"] == "ember-trace" and document["source_digest"] == environment()["source_digest"]
    runs = {entry["signature"]: entry["runs"] for entry in document["schedules"]}
    assert 2 in runs.values()
    assert document["regions"] == [{"node": "row", "shape": [3, 4], "ranges": [[2, 3], [0, 4]]}]
    assert document["kernel_times"] and all(t["seconds"] > 0 for t in document["kernel_times"].values())
    assert not (tmp_path / "other.json").exists()
    from ember.scheduler.profile import current

    assert current() == ()  # the trace's kernel timing ended with it


def test_a_device_fingerprint_is_the_same_in_every_process() -> None:
    # a set's order follows its members' hashes, which PYTHONHASHSEED changes: a fingerprint that printed a set in
    # its own order (OpenCL's fallback vector widths hold sets of ops) made plans unusable in the next process
    code = ("import sys, ember; from ember.scheduler.devices import get_device; "
            "from ember.plan.planner import device_fingerprint; "
            "print(*(device_fingerprint(get_device(name)) for name in sys.argv[1:]))")
    printed = {_run(["-c", code, *TEST_DEVICES], {"PYTHONHASHSEED": seed}).strip() for seed in ("1", "2", "3")}
    assert len(printed) == 1, printed
