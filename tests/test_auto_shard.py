"""Automatic sharding without EMBER_AUTO_SHARD: a matmul too large for its device's pool is split across the
devices with room, a matmul that a (given) speed table says is faster split is split, small or cheap work never is,
and an output that fits nowhere raises naming the sizes and the pools; every result against torch."""

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.__main__ import main
from ember.context import overriding
from ember.core.errors import OutOfMemoryError
from ember.scheduler.devices import get_device
from ember.sharding import automatic, calibration
from ember.sharding.decision import MINIMUM_ELEMENTS, ShardingMemoryError, decide
from ember.sharding.slicing import reshape_bounds
from tests.helpers import random_array

ALL_DEVICES = automatic.compute_devices()
SECOND = [device for device in ALL_DEVICES if not device.startswith("c:")]  # opencl:0, wgpu:0 where they work


@pytest.fixture(params=SECOND or [pytest.param("", marks=pytest.mark.skip(reason="needs opencl or wgpu"))])
def other(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The device that shares c:0's work: automatic sharding sees these two (each second backend in turn). Here
    PoCL and lavapipe run on the CPU's cores too, which never share c:0's work: they stand for a GPU (not on the
    host's cores) in these tests."""
    if "c:0" not in ALL_DEVICES:
        pytest.skip("needs the c device")
    monkeypatch.setattr(automatic, "compute_devices", lambda: ["c:0", request.param])
    device = get_device(request.param)
    monkeypatch.setattr(device, "info", dataclasses.replace(device.info, host_cores=False))
    return str(request.param)


@pytest.fixture
def limits() -> Iterator[dict[str, int]]:
    """Pool limits as bytes free beyond what each pool holds now (restored after the test)."""
    before = {device: get_device(device).pool.limit_bytes for device in ALL_DEVICES}
    free: dict[str, int] = {}
    yield free
    for device, limit in before.items():
        get_device(device).pool.limit_bytes = limit


def _limit(free: dict[str, int], device: str, nbytes: int) -> None:
    pool = get_device(device).pool
    free[device] = nbytes
    pool.limit_bytes = pool.used_bytes + nbytes


def _kernel_devices(record: Any) -> set[str]:
    return {kernel.device for kernel in record.kernels}


def test_matmul_too_large_for_its_pool_is_split_by_rows_and_matches_torch(
        other: str, limits: dict[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    # 4100 x 512 @ 512 x 256: the output (4.2 MB) and A (8.4 MB) need 13 MB on c:0, which has 11 MB free
    a_data, b_data = random_array((4100, 512)), random_array((512, 256), seed=1)
    _limit(limits, "c:0", 11_000_000)
    _limit(limits, other, 12_000_000)
    automatic.RECENT.clear()
    with em.profile() as record, overriding(debug_level=1):
        result = em.tensor(a_data) @ em.tensor(b_data)
        result.realize()
    decision = automatic.RECENT[-1]
    assert f"auto-shard: {decision.describe()}" in capsys.readouterr().err  # EMBER_DEBUG=1 reports it
    assert decision.axis == 0 and sorted(decision.devices) == ["c:0", other], decision.describe()
    shares = dict(zip(decision.devices, decision.lengths))
    assert sum(decision.lengths) == 4100 and 0 < shares["c:0"] < shares[other]  # c:0's share bounded by its pool
    assert "free" in decision.reason and f"split by rows ({other}" in decision.describe()
    assert _kernel_devices(record) == {"c:0", other}
    assert result.device == "c:0"
    for device in ("c:0", other):
        assert record.peak_bytes[device] <= limits[device] + get_device(device).pool.used_bytes
    expected = torch.tensor(a_data) @ torch.tensor(b_data)
    np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-4, atol=1e-3)


def test_split_by_columns_when_the_right_operand_is_the_large_one(other: str, limits: dict[str, int]) -> None:
    # 256 x 512 @ 512 x 4100: B is 8.4 MB; columns need only B's columns on each device
    a_data, b_data = random_array((256, 512)), random_array((512, 4100), seed=2)
    _limit(limits, "c:0", 12_000_000)
    _limit(limits, other, 12_000_000)
    automatic.RECENT.clear()
    result = (em.tensor(a_data) @ em.tensor(b_data)).relu()
    result.realize()
    decision = automatic.RECENT[-1]
    assert decision.axis == 1 and sum(decision.lengths) == 4100, decision.describe()
    expected = (torch.tensor(a_data) @ torch.tensor(b_data)).relu()
    np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-4, atol=1e-3)


def test_auto_shard_0_turns_the_rules_off(other: str, limits: dict[str, int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.settings import CONFIG

    monkeypatch.setattr(CONFIG, "auto_shard", False)
    _limit(limits, "c:0", 11_000_000)
    product = em.tensor(random_array((4100, 512))) @ em.tensor(random_array((512, 256)))
    with pytest.raises(OutOfMemoryError) as caught:
        product.realize()
    assert not isinstance(caught.value, ShardingMemoryError) and "memory pool c:0" in str(caught.value)


def test_output_that_fits_nowhere_raises_naming_sizes_and_pools(other: str, limits: dict[str, int]) -> None:
    _limit(limits, "c:0", 3_000_000)
    _limit(limits, other, 3_000_000)
    product = em.tensor(random_array((4100, 512))) @ em.tensor(random_array((512, 256)))
    with pytest.raises(ShardingMemoryError, match=rf"shape \(4100, 256\).*4\.0 MiB.*c:0: 2\.9 MiB free.*{other}: 2\.9"):
        product.realize()
    assert issubclass(ShardingMemoryError, OutOfMemoryError)


def test_a_speed_table_where_splitting_pays_splits_and_matches_torch(other: str) -> None:
    # 1030 x 128 @ 128 x 1024: 135 million multiply-adds; with two equally fast independent devices, half the time
    rates = {(source, target): 1e11 for source in ("host", "c:0", other) for target in ("c:0", other)}
    table = calibration.Calibration({"c:0": 1e9, other: 1e9}, rates, overlap=1.0, measured=False)
    a_data, b_data = random_array((1030, 128)), random_array((128, 1024), seed=3)
    a_data[3, 5], a_data[1020, 7], b_data[9, 1000] = np.nan, np.inf, -np.inf  # in both shares
    automatic.RECENT.clear()
    with calibration.using(table), em.profile() as record:
        result = em.tensor(a_data) @ em.tensor(b_data)
        result.realize()
    decision = automatic.RECENT[-1]
    assert decision.reason == "faster split" and sorted(decision.devices) == ["c:0", other], decision.describe()
    assert _kernel_devices(record) == {"c:0", other}
    expected = torch.tensor(a_data) @ torch.tensor(b_data)
    np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-4, atol=1e-3)  # NaN and inf in place
    # a device ten times as fast takes most of the rows (not divisible evenly)
    table.speeds[other] = 1e10
    with calibration.using(table):
        result = (em.tensor(a_data) @ em.tensor(b_data)) * 2
        result.realize()
    decision = automatic.RECENT[-1]
    shares = dict(zip(decision.devices, decision.lengths))
    assert shares[other] > 5 * shares.get("c:0", 0) > 0, decision.describe()
    np.testing.assert_allclose(result.numpy(), (expected * 2).numpy(), rtol=1e-4, atol=1e-3)


def test_the_same_table_with_devices_taking_turns_does_not_split(other: str) -> None:
    rates = {(source, target): 1e11 for source in ("host", "c:0", other) for target in ("c:0", other)}
    table = calibration.Calibration({"c:0": 1e9, other: 1e9}, rates, overlap=0.0, measured=False)
    product = em.tensor(random_array((1030, 128))) @ em.tensor(random_array((128, 1024)))
    with calibration.using(table):
        assert decide(_placed(product), None, ["c:0", other]) is None


def _placed(tensor: em.Tensor) -> "em.core.graph.Node":
    from ember.scheduler.placement import place_graph

    place_graph([tensor.node])
    return tensor.node


def test_small_or_cheap_work_is_never_split_and_the_measured_speeds(other: str) -> None:
    # below MINIMUM_ELEMENTS, and elementwise work of any size: decided without measuring anything
    before = calibration.current()
    assert decide(_placed(em.tensor(random_array((1000, 1000))) @ em.tensor(random_array((1000, 1000)))), None,
                  ["c:0", other]) is None
    big = em.tensor(random_array((2048, 1024))) * 2 + 1
    assert big.numel() >= MINIMUM_ELEMENTS and decide(_placed(big), None, ["c:0", other]) is None
    assert calibration.current() is before
    table = calibration.calibration(["c:0", other])
    assert all(speed > 0 for speed in table.speeds.values()) and 0.0 <= table.overlap <= 1.0
    print("\n".join(table.describe()))
    # devices of one speed that barely run at once: a split cannot pay (decided from a fixed table: a measured one
    # follows the machine's load; a loaded CI machine once measured c:0 at half its speed, and split)
    rates = {(source, target): 1e11 for source in ("host", "c:0", other) for target in ("c:0", other)}
    slow_together = calibration.Calibration({"c:0": 1e9, other: 1e9}, rates, overlap=0.4, measured=False)
    product = em.tensor(random_array((1030, 128))) @ em.tensor(random_array((128, 1024)))
    with calibration.using(slow_together):
        assert decide(_placed(product), None, ["c:0", other]) is None


@pytest.mark.skipif("c:0" not in ALL_DEVICES, reason="needs the c device")
def test_forced_mode_splits_evenly_by_rows() -> None:
    node = _placed(em.tensor(random_array((1030, 1024))) + 1)
    decision = decide(node, True, ["c:0", "dummy:1"])
    assert decision is not None and decision.lengths == [515, 515] and decision.axis == 0


def test_reshape_bounds() -> None:
    assert reshape_bounds((6, 4), (6, 1, 4), ((2, 5), (0, 1), (0, 4))) == ((2, 5), (0, 4))
    assert reshape_bounds((6, 4), (24,), ((8, 16),)) == ((2, 4), (0, 4))
    assert reshape_bounds((6, 4), (24,), ((8, 15),)) is None
    assert reshape_bounds((4, 6), (1, 4, 6), ((0, 1), (0, 4), (3, 5))) == ((0, 4), (3, 5))


def test_ember_info_calibrate_shows_the_measured_speeds_and_decisions(other: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--calibrate"]) == 0
    shown = capsys.readouterr().out
    assert f"automatic sharding across c:0, {other}" in shown and "devices run at once" in shown
    assert f"c:0 -> {other}" in shown and "4096x1024 @ 1024x4096: " in shown


def test_devices_on_the_same_cpu_cores_never_share_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """PoCL or lavapipe beside the c backend run on the same cores: a split would only take them from c (a noisy
    speed measurement sent most of a 50,257-token output layer's gradient to PoCL: 3 s a step became 8-16 s)."""
    hosts = [device for device in SECOND if get_device(device).info.host_cores]
    if "c:0" not in ALL_DEVICES or not hosts:
        pytest.skip("needs the c device and a CPU OpenCL or WebGPU device")
    assert get_device("c:0").info.host_cores
    monkeypatch.setattr(automatic, "compute_devices", lambda: ["c:0", *hosts])
    rates = {(source, target): 1e11 for source in ("host", "c:0", *hosts) for target in ("c:0", *hosts)}
    table = calibration.Calibration({"c:0": 1e9, **{device: 1e10 for device in hosts}}, rates, overlap=1.0,
                                    measured=False)  # (the others measured ten times as fast)
    a_data, b_data = random_array((1030, 128)), random_array((128, 1024), seed=3)
    with calibration.using(table), em.profile() as record:
        result = em.tensor(a_data) @ em.tensor(b_data)
        result.realize()
    assert _kernel_devices(record) == {"c:0"}
    np.testing.assert_allclose(result.numpy(), a_data @ b_data, rtol=1e-4, atol=1e-3)


def test_a_share_that_must_repeat_its_producers_whole_does_not_split(other: str) -> None:
    # an output layer's weight gradient (softmax(h @ w.T) - one_hot).T @ h: a share of its rows (or columns) still
    # needs every logit (a softmax's row statistics), so each device would repeat the whole forward product; the
    # same table splits a plain product of that size (above)
    rates = {(source, target): 1e11 for source in ("host", "c:0", other) for target in ("c:0", other)}
    table = calibration.Calibration({"c:0": 1e9, other: 1e9}, rates, overlap=1.0, measured=False)
    hidden, weight = em.tensor(random_array((512, 128))), em.tensor(random_array((8192, 128), seed=1))
    probabilities = (hidden @ weight.T).softmax(-1)
    gradient = (probabilities - em.tensor(np.eye(8192, dtype=np.float32)[np.arange(512) * 13])).T @ hidden
    with calibration.using(table):
        assert decide(_placed(gradient), None, ["c:0", other]) is None
        plain = em.tensor(random_array((8192, 512))) @ em.tensor(random_array((512, 128)))
        assert decide(_placed(plain), None, ["c:0", other]) is not None


def test_work_that_fits_its_pool_builds_no_axis_model(other: str, limits: dict[str, int],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool that reports its free memory (a GPU's does, c:0's with a limit) asks the memory rule at every large
    realize: where every leaf and the output fit, the per-axis models (which slice the graph: 0.3 ms a softmax on
    an H100) are not built; where they do not, they are, and the work is split."""
    from ember.sharding import decision

    built: list[int] = []
    models = decision._axis_models
    monkeypatch.setattr(decision, "_axis_models", lambda root: built.append(1) or models(root))
    _limit(limits, "c:0", 64 << 20)
    data = random_array((1024, 1100))
    x = em.tensor(data).realize()
    result = x.softmax(-1).realize()
    assert built == []
    np.testing.assert_allclose(result.numpy(), torch.tensor(data).softmax(-1).numpy(), rtol=1e-5, atol=1e-6)
    _limit(limits, "c:0", 11_000_000)  # 12.5 MiB of inputs and output: split by rows
    a, b = random_array((4100, 512)), random_array((512, 256))
    product = (em.tensor(a) @ em.tensor(b)).realize()
    assert built
    np.testing.assert_allclose(product.numpy(), (torch.tensor(a) @ torch.tensor(b)).numpy(), rtol=1e-4, atol=1e-3)


def test_the_rules_are_not_asked_where_no_listed_device_could_share_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every other listed device runs on c:0's cores (PoCL, lavapipe) or none is listed, no rule could split
    c:0's work: a large output's realize does not run them (their walk of its graph cost a batched matmul realized
    each time ~35 us of its 1 ms); a listed device off the host's cores (standing for a GPU) makes them decide again.
    The values against numpy either way."""
    if "c:0" not in ALL_DEVICES:
        pytest.skip("needs the c device")
    asked: list[Any] = []
    original = automatic.decide
    monkeypatch.setattr(automatic, "decide", lambda *arguments: asked.append(arguments[0]) or original(*arguments))
    a_data, b_data = random_array((1100, 64)), random_array((64, 1000), seed=1)
    others = [device for device in ALL_DEVICES if device != "c:0"]
    result = (em.tensor(a_data, device="c") @ em.tensor(b_data, device="c")).numpy()
    np.testing.assert_allclose(result, a_data @ b_data, rtol=1e-4, atol=1e-4)
    assert 1100 * 1000 >= MINIMUM_ELEMENTS
    assert bool(asked) == any(not get_device(device).info.host_cores for device in others)
    assert automatic._may_share("c:0") == bool(asked)
    if others:
        device = get_device(others[0])
        monkeypatch.setattr(device, "info", dataclasses.replace(device.info, host_cores=False))
        assert automatic._may_share("c:0")
        asked.clear()
        result = (em.tensor(a_data, device="c") @ em.tensor(b_data, device="c")).numpy()
        np.testing.assert_allclose(result, a_data @ b_data, rtol=1e-4, atol=1e-4)
        assert asked
    assert not automatic._may_share("dummy:0")  # (not a compute device: the rules never split its work)
