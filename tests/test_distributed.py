"""ember.distributed and DistributedDataParallel on 2 and 3 MPI ranks (mpiexec, run from here with a time limit):
every collective against numpy, DDP training on N ranks against torch on one process with the whole batch, under
ember.jit too, checkpoints saved by rank 0 and loaded by every rank, and a failing or silent rank ending every rank
with a clear error instead of a hang. The scripts the ranks run are written into tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ember as em
import ember.distributed as dist
from tests.conftest import TEST_DEVICES

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = dist.find_mpiexec()
LIMIT = 60  # seconds for one mpiexec run
needs_mpi = pytest.mark.skipif(not dist.is_available() or MPIEXEC is None,
                               reason="ember.distributed needs mpi4py and mpiexec: pip install mpi4py mpich")
mpi_group = pytest.mark.xdist_group("mpi")  # the runs start several processes: one xdist worker runs them all


def run_ranks(tmp_path: Path, script: str, ranks: int, config: dict | None = None) -> subprocess.CompletedProcess:
    """Run `script` on `ranks` MPI ranks (this tree's ember, the config as CONFIG); the completed run."""
    path = tmp_path / "script.py"
    path.write_text(f"CONFIG = {json.dumps(config or {})!r}\n{PRELUDE}\n{script}")
    # (Open MPI's mpiexec refuses to start as root, as in a container, unless told twice; MPICH ignores these)
    environment = dict(os.environ, PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"),
                       OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    assert MPIEXEC is not None
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(path)], capture_output=True, text=True,
                          timeout=LIMIT, cwd=tmp_path, env=environment)


def passed(run: subprocess.CompletedProcess, ranks: int) -> None:
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    for rank in range(ranks):
        assert f"rank {rank} ok" in run.stdout, output


PRELUDE = """
import datetime
import json
import numpy as np
import ember as em
import ember.distributed as dist
CONFIG = json.loads(CONFIG)
# a collective waiting longer than this fails (and aborts every rank) within the test's time limit
dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=CONFIG.get("timeout", 45)))
RANK, SIZE = dist.get_rank(), dist.get_world_size()
"""

COLLECTIVES = """
from ember.distributed import ReduceOp

assert dist.is_initialized() and dist.get_backend() == "mpi" and 0 <= RANK < SIZE
try:
    dist.init_process_group("mpi")
except dist.DistributedError as error:
    assert "initialize the default process group twice" in str(error), error
else:
    raise AssertionError("a second init_process_group was accepted")

def data(rank, shape, dtype, nan=False):
    generator = np.random.default_rng(1000 + rank)
    if dtype == np.bool_:
        return generator.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return generator.integers(1, 9, size=shape).astype(dtype)
    values = generator.uniform(-2, 2, size=shape).astype(dtype)
    if nan and rank == 1:
        values.reshape(-1)[::7] = np.nan
    return values

def reduce(rows, op):
    table = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.fmin,
             ReduceOp.MAX: np.fmax, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
             ReduceOp.BXOR: np.bitwise_xor}
    if rows[0].dtype == np.bool_:
        table.update({ReduceOp.SUM: np.logical_or, ReduceOp.MAX: np.logical_or, ReduceOp.MIN: np.logical_and,
                      ReduceOp.PRODUCT: np.logical_and})
    result = rows[0]
    for row in rows[1:]:
        result = table[op](result, row)
    if op in (ReduceOp.MIN, ReduceOp.MAX):  # NaN anywhere is NaN, as torch.maximum / torch.minimum
        result = np.where(np.isnan(rows).any(0), np.nan, result) if rows[0].dtype.kind == "f" else result
    return result / len(rows) if op is ReduceOp.AVG else result

def close(actual, expected, dtype):
    tolerance = {np.float16: 2e-3, "bfloat16": 1e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tolerance,
                               atol=tolerance, equal_nan=True)

KINDS = [(np.float32, em.float32), (np.float64, em.float64), (np.int32, em.int32), (np.int64, em.int64),
         (np.uint8, em.uint8), (np.bool_, em.bool), (np.float16, em.float16), ("bfloat16", em.bfloat16)]
for device in CONFIG["devices"]:
    kinds = KINDS if device.startswith("c:") else KINDS[:1] + KINDS[2:3]
    for numpy_dtype, dtype in kinds:
        host_dtype = np.float32 if numpy_dtype == "bfloat16" else numpy_dtype
        shape = (7, 5)
        rows = np.stack([data(rank, shape, host_dtype, nan=True) for rank in range(SIZE)])
        if numpy_dtype == "bfloat16":  # the values bfloat16 holds
            rows = np.stack([em.tensor(row, dtype=dtype).float().numpy() for row in rows])
        ops = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
        kind = np.dtype(host_dtype).kind
        ops += [ReduceOp.AVG] if kind == "f" else [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
        for op in ops:
            tensor = em.tensor(rows[RANK], dtype=dtype, device=device)
            dist.all_reduce(tensor, op)
            assert tensor.dtype == dtype and tensor.shape == shape and str(tensor.device) == device
            expected = reduce(rows, op).astype(host_dtype)
            if numpy_dtype == "bfloat16" or numpy_dtype == np.float16:
                expected = em.tensor(reduce(rows.astype(np.float32), op), dtype=dtype).float().numpy()
            close(tensor.float().numpy() if numpy_dtype == "bfloat16" else tensor.numpy(), expected, numpy_dtype)
        tensor = em.tensor(rows[RANK], dtype=dtype, device=device)
        dist.broadcast(tensor, src=SIZE - 1)
        close(tensor.float().numpy() if numpy_dtype == "bfloat16" else tensor.numpy(), rows[SIZE - 1], numpy_dtype)
        gathered = [em.zeros(shape, dtype=dtype, device=device) for _ in range(SIZE)]
        dist.all_gather(gathered, em.tensor(rows[RANK], dtype=dtype, device=device))
        for rank in range(SIZE):
            close(gathered[rank].float().numpy() if numpy_dtype == "bfloat16" else gathered[rank].numpy(), rows[rank],
                  numpy_dtype)
        # reduce_scatter: rank r gets the sum over ranks of their input_list[r]
        inputs = [np.stack([data(10 * rank + target, (3, 4), host_dtype) for target in range(SIZE)])
                  for rank in range(SIZE)]
        if numpy_dtype == "bfloat16":
            inputs = [em.tensor(block, dtype=dtype).float().numpy() for block in inputs]
        output = em.zeros((3, 4), dtype=dtype, device=device)
        dist.reduce_scatter(output, [em.tensor(block, dtype=dtype, device=device) for block in inputs[RANK]])
        expected = reduce(np.stack([inputs[rank][RANK] for rank in range(SIZE)]), ReduceOp.SUM)
        close(output.float().numpy() if numpy_dtype == "bfloat16" else output.numpy(),
              em.tensor(expected.astype(np.float32), dtype=dtype).float().numpy() if numpy_dtype == "bfloat16"
              else expected.astype(host_dtype), numpy_dtype)
    # a large sum (MPI's algorithms for long messages), a view and a zero-size tensor
    large = [data(rank, (300_001,), np.float32) for rank in range(SIZE)]
    tensor = em.tensor(large[RANK], device=device)
    dist.all_reduce(tensor)
    np.testing.assert_allclose(tensor.numpy(), np.sum(large, axis=0), rtol=1e-5, atol=1e-5)
    base = em.tensor(np.stack(large)[:, :12].reshape(SIZE, 3, 4), device=device)
    column = base[RANK][:, 1]  # a strided view: all_reduce writes through it into base
    dist.all_reduce(column, ReduceOp.MAX)
    expected = np.stack(large)[:, :12].reshape(SIZE, 3, 4)
    expected[RANK][:, 1] = expected[:, :, 1].max(0)
    np.testing.assert_allclose(base.numpy(), expected, rtol=1e-6)
    empty = em.zeros((0, 3), device=device)
    dist.all_reduce(empty)
    assert empty.shape == (0, 3)
    # under ember.jit the collectives are steps of the captured program: each replay exchanges its own values
    state = em.zeros(5, device=device)

    @em.jit
    def step(values):
        doubled = values * 2
        dist.all_reduce(doubled)
        state.add_(doubled)
        dist.all_reduce(state, ReduceOp.MAX)
        return doubled + 1

    total = np.zeros(5, np.float32)
    for call in range(5):
        values = [data(100 * call + rank, (5,), np.float32) for rank in range(SIZE)]
        result = step(em.tensor(values[RANK], device=device))
        total = total + 2 * np.sum(values, axis=0)
        np.testing.assert_allclose(result.numpy(), 2 * np.sum(values, axis=0) + 1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(state.numpy(), total, rtol=1e-5, atol=1e-5)
    assert step.captures == 1 and step.replays == 3
# the *_tensor forms (pieces along dim 0, or stacked) and the object collectives
rows = np.stack([data(rank, (2, 3), np.float32) for rank in range(SIZE)])
concatenated, stacked = em.zeros(2 * SIZE, 3), em.zeros(SIZE, 2, 3)
dist.all_gather_into_tensor(concatenated, em.tensor(rows[RANK]))
dist.all_gather_into_tensor(stacked, em.tensor(rows[RANK]))
np.testing.assert_array_equal(concatenated.numpy(), rows.reshape(2 * SIZE, 3))
np.testing.assert_array_equal(stacked.numpy(), rows)
wholes = [data(50 + rank, (SIZE * 2, 3), np.float32) for rank in range(SIZE)]
output = em.zeros(2, 3)
dist.reduce_scatter_tensor(output, em.tensor(wholes[RANK]), ReduceOp.MAX)
np.testing.assert_array_equal(output.numpy(), np.max([whole[2 * RANK:2 * RANK + 2] for whole in wholes], axis=0))
try:
    dist.all_gather_into_tensor(em.zeros(2 * SIZE + 1, 3), em.tensor(rows[RANK]))
except dist.DistributedError as error:
    assert "must have input_tensor's dtype and shape" in str(error), error
else:
    raise AssertionError("a wrong output shape was accepted")
objects = [None] * SIZE
dist.all_gather_object(objects, {"rank": RANK, "name": "x" * RANK})
assert objects == [{"rank": rank, "name": "x" * rank} for rank in range(SIZE)], objects
settings = [{"lr": 0.1, "steps": [1, 2]}, "sent"] if RANK == SIZE - 1 else [None, None]
dist.broadcast_object_list(settings, src=SIZE - 1)
assert settings == [{"lr": 0.1, "steps": [1, 2]}, "sent"], settings
dist.barrier()
statistics = dist.collective_statistics()
assert statistics.calls > 50 and statistics.seconds > 0 and statistics.bytes > 300_000 * 4, statistics
print(f"rank {RANK} ok")
"""


@needs_mpi
@mpi_group
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_collective_matches_numpy(tmp_path: Path, ranks: int) -> None:
    # (with only other backends under test, e.g. EMBER_TEST_DEVICES=cuda, the collectives still run on c)
    devices = [device for device in TEST_DEVICES if device.split(":")[0] in ("c", "wgpu")] or ["c:0"]
    passed(run_ranks(tmp_path, COLLECTIVES, ranks, {"devices": devices if ranks == 2 else devices[:1]}), ranks)


TRAINING = """
import torch
import ember.nn as nn
import ember.nn.functional as F
from ember.nn.parallel import DistributedDataParallel
from ember.utils.data import DistributedSampler

BATCH, STEPS = 12, 4

def ember_model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 10))

def torch_model():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(4, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(6 * 4 * 4, 10))

generator = np.random.default_rng(0)
images = generator.standard_normal((STEPS * BATCH, 1, 8, 8)).astype(np.float32)
labels = generator.integers(0, 10, STEPS * BATCH)
optimizers = {"adamw": (em.optim.AdamW, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.01}),
              "sgd": (em.optim.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})}
sampler = DistributedSampler(range(BATCH), shuffle=False)  # this rank's share of each batch
assert sampler.num_replicas == SIZE and sampler.rank == RANK

def train_and_compare(optimizer_name, jit, bucket_mb, buckets):
    em.manual_seed(100 + RANK)  # every rank starts elsewhere: the wrap broadcasts rank 0's parameters
    model = DistributedDataParallel(ember_model(), bucket_cap_mb=bucket_mb)
    assert len(model.reducer.buckets) == buckets, len(model.reducer.buckets)
    reference = torch_model()
    with torch.no_grad():
        for ours, theirs in zip(model.module.parameters(), reference.parameters()):
            theirs.copy_(torch.tensor(ours.numpy()))
    ember_class, torch_class, options = optimizers[optimizer_name]
    optimizer = ember_class(model.parameters(), **options)
    torch_optimizer = torch_class(reference.parameters(), **options)

    def step(inputs, targets):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    train = em.jit(step) if jit else step
    for index in range(STEPS):
        batch = slice(index * BATCH, (index + 1) * BATCH)
        mine = np.arange(BATCH)[list(sampler)]
        train(em.tensor(images[batch][mine]), em.tensor(labels[batch][mine]))
        torch_optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(torch.tensor(images[batch])),
                                          torch.tensor(labels[batch])).backward()
        torch_optimizer.step()
    if jit:
        assert train.captures == 1 and train.replays == STEPS - 2, (train.captures, train.replays)
    # the Python hooks run in the eager steps and the capture; replays run the captured collectives
    assert model.reducer.reductions == (2 if jit else STEPS) * buckets
    flat = np.concatenate([parameter.numpy().reshape(-1) for parameter in model.parameters()])
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-4, atol=2e-5)
    gathered = [em.zeros(flat.shape) for _ in range(SIZE)]
    dist.all_gather(gathered, em.tensor(flat))
    for rank in range(SIZE):  # every rank holds the very same parameters
        np.testing.assert_array_equal(gathered[rank].numpy(), flat)

for run in CONFIG["runs"]:
    train_and_compare(*run)
print(f"rank {RANK} ok")
"""


@needs_mpi
@mpi_group
@pytest.mark.parametrize("ranks, runs", [
    (2, [("adamw", False, 25, 1), ("sgd", True, 0.0005, 5)]),
    (3, [("sgd", False, 0.0005, 5), ("adamw", True, 25, 1)]),
])
def test_data_parallel_training_matches_torch_on_the_whole_batch(tmp_path: Path, ranks: int, runs: list) -> None:
    """Each run: (optimizer, under ember.jit, bucket_cap_mb, the buckets that makes for the model's 6 parameters)."""
    passed(run_ranks(tmp_path, TRAINING, ranks, {"runs": runs}), ranks)


CHECKPOINT = """
import ember.nn as nn
from ember.nn.parallel import DistributedDataParallel

em.manual_seed(RANK)
model = DistributedDataParallel(nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 2)))
model(em.randn(8, 5)).sum().backward()  # running statistics differ between the ranks now
path = CONFIG["path"]
if RANK == 0:
    em.save(model.state_dict(), path)
dist.barrier()  # the file is complete before any rank reads it
saved = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
em.manual_seed(50 + RANK)
fresh = DistributedDataParallel(nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 2)),
                                init_sync=False)
fresh.load_state_dict(em.load(path))
assert sorted(fresh.state_dict()) == sorted(saved) and all(name.startswith("module.") for name in saved)
for name, tensor in fresh.state_dict().items():
    mine = tensor.numpy()
    rank_zero = em.tensor(mine)
    dist.broadcast(rank_zero, 0)
    np.testing.assert_array_equal(mine, rank_zero.numpy(), err_msg=name)
print(f"rank {RANK} ok")
"""


@needs_mpi
@mpi_group
def test_rank_zero_saves_and_every_rank_loads_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    passed(run_ranks(tmp_path, CHECKPOINT, 2, {"path": str(path)}), 2)
    with open(path, "rb") as file:
        header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
    assert "module.0.weight" in json.dumps(header)


FAILING = """
import time
x = em.ones(3)
if RANK == CONFIG["failing"]:
    if CONFIG["mode"] == "raise":
        raise ValueError("this rank fails on purpose")
    time.sleep(40)  # silent: the others' collective times out
dist.all_reduce(x)
print(f"rank {RANK} passed the collective")
"""


@needs_mpi
@mpi_group
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_rank_that_raises_ends_every_rank(tmp_path: Path, ranks: int) -> None:
    started = time.monotonic()
    run = run_ranks(tmp_path, FAILING, ranks, {"failing": 1, "mode": "raise"})
    output = run.stdout + run.stderr
    assert run.returncode != 0 and time.monotonic() - started < LIMIT
    assert f"rank 1 of {ranks} raised an exception; aborting all {ranks} ranks" in output, output
    assert "ValueError: this rank fails on purpose" in output
    assert "passed the collective" not in output


@needs_mpi
@mpi_group
def test_a_collective_waiting_past_the_timeout_ends_every_rank(tmp_path: Path) -> None:
    started = time.monotonic()
    run = run_ranks(tmp_path, FAILING, 2, {"failing": 1, "mode": "sleep", "timeout": 2})
    output = run.stdout + run.stderr
    assert run.returncode != 0 and time.monotonic() - started < 30, output
    assert "ember.distributed.all_reduce: rank 0 of 2 waited 2 s for the other ranks" in output, output
    assert "rank 0 of 2 raised an exception" in output


# ---- in this process: errors that need no MPI run -------------------------------------------------------------


def test_an_unknown_backend_names_the_valid_one() -> None:
    for backend in ("nccl", "gloo"):
        with pytest.raises(dist.DistributedError, match=f"backend '{backend}' is not available in ember; the valid "
                                                        "backend is 'mpi'"):
            dist.init_process_group(backend)
    assert not dist.is_initialized()


def test_without_mpi4py_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # an import of it fails as if it were not installed
    with pytest.raises(dist.DistributedError, match=r'pip install "ember\[distributed\]" \(or: pip install mpi4py '
                                                    r'mpich\)'):
        dist.init_process_group("mpi")
    assert not dist.is_initialized()


def test_calls_before_init_process_group_say_so() -> None:
    for call in (dist.get_rank, dist.get_world_size, dist.barrier, lambda: dist.all_reduce(em.ones(2)),
                 lambda: em.nn.parallel.DistributedDataParallel(em.nn.Linear(2, 2))):
        with pytest.raises(dist.DistributedError, match="Default process group has not been initialized"):
            call()
    with pytest.raises(RuntimeError, match="init_process_group"):
        em.utils.data.DistributedSampler(list(range(4)))


def test_post_accumulate_grad_hooks_see_the_accumulated_gradient_as_in_torch() -> None:
    """DistributedDataParallel's trigger: called once per leaf and backward, after .grad holds the sum."""
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    seen: dict[str, list[np.ndarray]] = {"ember": [], "torch": []}
    ours = em.tensor(values, requires_grad=True)
    theirs = torch.tensor(values, requires_grad=True)
    ours.register_post_accumulate_grad_hook(lambda tensor: seen["ember"].append(tensor.grad.numpy()))
    theirs.register_post_accumulate_grad_hook(lambda tensor: seen["torch"].append(tensor.grad.numpy().copy()))
    for _ in range(2):
        (ours * ours).sum().backward()
        (theirs * theirs).sum().backward()
    assert len(seen["ember"]) == len(seen["torch"]) == 2
    for mine, reference in zip(seen["ember"], seen["torch"]):
        np.testing.assert_array_equal(mine, reference)
    with pytest.raises(em.AutogradError, match="not a leaf"):
        (ours * 2).register_post_accumulate_grad_hook(lambda tensor: None)


OPTIONS = """
import torch
import ember.nn as nn
from ember.nn.parallel import DistributedDataParallel
from ember.distributed import DistributedError

class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.left, self.right = nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, inputs, branch):
        hidden = self.trunk(inputs).tanh()
        if branch == "both":
            return self.left(hidden) + self.right(hidden)
        return (self.right if branch == "right" else self.left)(hidden)

class TorchBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.left, self.right = torch.nn.Linear(4, 3), torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

    def forward(self, inputs, branch):
        hidden = self.trunk(inputs).tanh()
        if branch == "both":
            return self.left(hidden) + self.right(hidden)
        return (self.right if branch == "right" else self.left)(hidden)

def start(**options):
    em.manual_seed(RANK)
    model = DistributedDataParallel(Branches(), **options)
    reference = TorchBranches()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            parameter.copy_(torch.tensor(model.module.get_parameter(name).numpy()))
    return model, reference

def same_gradients(model, reference):
    for name, parameter in reference.named_parameters():
        ours = model.module.get_parameter(name).grad
        if parameter.grad is None:
            assert ours is None or not np.any(ours.numpy()), name
            continue
        np.testing.assert_allclose(ours.numpy(), parameter.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)

generator = np.random.default_rng(0)
batches = [generator.standard_normal((SIZE * 3, 4)).astype(np.float32) for _ in range(2)]
mine = [batch[RANK * 3:(RANK + 1) * 3] for batch in batches]

# no_sync: the first micro-batch's gradient stays on this rank, the second backward averages the sum of both
model, reference = start()
calls = dist.collective_statistics().calls
with model.no_sync():
    model(em.tensor(mine[0]), "both").square().mean().backward()
assert dist.collective_statistics().calls == calls  # no collective inside no_sync
model(em.tensor(mine[1]), "both").square().mean().backward()
for batch in batches:
    reference(torch.tensor(batch), "both").square().mean().backward()
same_gradients(model, reference)

# find_unused_parameters: rank 0 uses the left branch, the others the right one; each rank's unused branch
# takes part with zeros, so each gradient is the average over the ranks of the per-rank losses
model, reference = start(find_unused_parameters=True)
model(em.tensor(mine[0]), "right" if RANK > 0 else "left").square().mean().backward()
total = sum(reference(torch.tensor(batches[0][rank * 3:(rank + 1) * 3]), "right" if rank > 0 else "left")
            .square().mean() for rank in range(SIZE)) / SIZE
total.backward()
same_gradients(model, reference)

# without find_unused_parameters, a parameter without a gradient leaves its bucket unreduced: the next forward
# says so (on every rank: no rank waits in a collective the others never start)
model, reference = start()
model(em.tensor(mine[0]), "left").square().mean().backward()
try:
    model(em.tensor(mine[1]), "left")
except DistributedError as error:
    assert "right.weight" in str(error) and "find_unused_parameters=True" in str(error), error
else:
    raise AssertionError("the unreduced bucket was not reported")

# broadcast_buffers: before each forward the buffers are rank 0's, then the forward updates them with this rank's
# batch (torch's semantics; the statistics differ between the ranks until the next forward)
model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)))
norm = model.module[1]
with em.no_grad():
    norm.running_mean.fill_(float(RANK + 1))
    norm.running_var.fill_(float(RANK + 2))
hidden = model.module[0](em.tensor(mine[0])).numpy()
model(em.tensor(mine[0]))
np.testing.assert_allclose(norm.running_mean.numpy(), 0.9 * 1.0 + 0.1 * hidden.mean(0), rtol=1e-5)
np.testing.assert_allclose(norm.running_var.numpy(), 0.9 * 2.0 + 0.1 * hidden.var(0, ddof=1), rtol=1e-5)
print(f"rank {RANK} ok")
"""


@needs_mpi
@mpi_group
def test_no_sync_and_unused_parameters_match_torch(tmp_path: Path) -> None:
    passed(run_ranks(tmp_path, OPTIONS, 2), 2)


def test_host_steps_run_again_at_every_jit_replay(device: str) -> None:
    """The mechanism under the collectives, without MPI: a host function over tensors' values (here numpy's
    cumulative sum) is a step of an ember.jit capture, run on each replay's values, between kernels."""
    from ember.distributed.collectives import exchange

    calls = []

    def cumulative(values: list[np.ndarray]) -> np.ndarray:
        calls.append(1)
        return np.cumsum(values[0] * values[1]).astype(np.float32)

    state = em.zeros(7, device=device)

    @em.jit
    def step(first: em.Tensor, second: em.Tensor) -> em.Tensor:
        summed = exchange(cumulative, [first + 1, second], (7,), em.float32)
        state.add_(summed).realize()  # (a state change must be realized inside the function to be captured)
        return summed.exp()

    total = np.zeros(7, np.float32)
    generator = np.random.default_rng(0)
    for _ in range(5):
        first, second = generator.standard_normal((2, 7)).astype(np.float32)
        result = step(em.tensor(first, device=device), em.tensor(second, device=device))
        expected = np.cumsum((first + 1) * second)
        total += expected
        np.testing.assert_allclose(result.numpy(), np.exp(expected), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state.numpy(), total, rtol=1e-5, atol=1e-5)
        assert str(result.device) == device
    assert step.captures == 1 and step.replays == 3 and len(calls) == 5


def test_ember_info_says_whether_distributed_runs(capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.__main__ import main
    from ember.distributed import launcher

    assert main(["info", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["distributed"]
    assert found["available"] == dist.is_available()
    if found["available"]:
        assert found["mpiexec"] == MPIEXEC and found["mpi4py"].count(".") >= 1
    monkeypatch.setattr(launcher, "is_available", lambda: False)
    assert main(["info"]) == 0
    assert 'distributed: unavailable: mpi4py is not installed: pip install "ember[distributed]"' in \
        capsys.readouterr().out
