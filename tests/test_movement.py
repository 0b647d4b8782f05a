"""Movement methods (views) against PyTorch: reshape, permute, expand, pad, flip, cat, split, ... and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember as em
from tests.helpers import BatchedChecks, assert_close, pair, random_array


def same(actual: object, expected: object) -> None:
    """Movement only moves values: they must match torch exactly."""
    assert_close(actual, expected, atol=0, rtol=0)


def count_kernels(*tensors: em.Tensor) -> int:
    with em.profile() as record:
        em.realize(*tensors)
    return len(record.kernels)


def test_reshape_view_flatten_unflatten(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17)), device)
    same(x.reshape(17, 3), tx.reshape(17, 3))
    same(x.view(-1), tx.view(-1))
    same(x.reshape((1, 51, 1)), tx.reshape((1, 51, 1)))
    same(x.T.reshape(-1), tx.T.reshape(-1))  # not contiguous: torch copies, ember views
    same(x.T.flatten(), tx.T.flatten())
    same(x.flatten(0, 0), tx.flatten(0, 0))
    same(x.unflatten(1, (1, 17)), tx.unflatten(1, (1, 17)))
    same(x.unflatten(-1, (-1, 1)), tx.unflatten(-1, (-1, 1)))
    same(x.reshape_as(x.T), tx.reshape_as(tx.T))
    same(x.view_as(x.T), tx.view_as(tx.T))
    y, ty = pair(random_array((2, 3, 4)), device)
    same(y.flatten(1), ty.flatten(1))
    same(y.flatten(-2, -1).unflatten(1, torch.Size((4, 3))), ty.flatten(-2, -1).unflatten(1, (4, 3)))
    empty, tempty = pair(random_array((0, 3)), device)
    same(empty.reshape(3, 0), tempty.reshape(3, 0))
    same(empty.flatten(), tempty.flatten())
    scalar, tscalar = pair(np.array(2.5, dtype=np.float32), device)
    same(scalar.flatten(), tscalar.flatten())
    same(scalar.reshape(1, 1), tscalar.reshape(1, 1))
    same(x.reshape(51)[3:9].reshape(2, 3), tx.reshape(51)[3:9].reshape(2, 3))
    same.verify()


def test_squeeze_unsqueeze(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((1, 3, 1, 17)), device)
    same(x.squeeze(), tx.squeeze())
    same(x.squeeze(0), tx.squeeze(0))
    same(x.squeeze(1), tx.squeeze(1))  # a dim that is not 1 stays
    same(x.squeeze((0, 2)), tx.squeeze((0, 2)))
    same(x.squeeze(-2), tx.squeeze(-2))
    same(x.unsqueeze(0), tx.unsqueeze(0))
    same(x.unsqueeze(-1), tx.unsqueeze(-1))
    same(x.unsqueeze(2), tx.unsqueeze(2))
    scalar, tscalar = pair(np.array(1.5, dtype=np.float32), device)
    same(scalar.unsqueeze(0), tscalar.unsqueeze(0))
    same(scalar.unsqueeze(-1).squeeze(0), tscalar.unsqueeze(-1).squeeze(0))
    same(scalar.squeeze(), tscalar.squeeze())
    same.verify()


def test_permute_transpose_t_mt(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((2, 3, 17)), device)
    same(x.permute(2, 0, 1), tx.permute(2, 0, 1))
    same(x.permute((-1, 1, 0)), tx.permute((-1, 1, 0)))
    same(x.transpose(0, 2), tx.transpose(0, 2))
    same(x.transpose(-1, -2), tx.transpose(-1, -2))
    same(x.swapaxes(0, 1), tx.swapaxes(0, 1))
    same(x.mT, tx.mT)
    same(x.movedim(0, -1), tx.movedim(0, -1))
    same(x.movedim((0, 1), (2, 0)), tx.movedim((0, 1), (2, 0)))
    same(x[0].T, tx[0].T)
    same(x[0].t(), tx[0].t())
    same(x.mT.mT, tx)
    vector, tvector = pair(random_array((3,)), device)
    same(vector.t(), tvector.t())
    same(em.transpose(x, 0, 1), torch.transpose(tx, 0, 1))
    same(em.permute(x, (1, 2, 0)), torch.permute(tx, (1, 2, 0)))
    same.verify()


def test_expand_and_broadcast(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 1)), device)
    same(x.expand(3, 17), tx.expand(3, 17))
    same(x.expand(2, -1, 4), tx.expand(2, -1, 4))
    same(x.expand((1, 3, 1)), tx.expand((1, 3, 1)))
    same(x.expand(3, 0), tx.expand(3, 0))
    other, tother = pair(random_array((5, 3, 17)), device)
    same(x.expand_as(other), tx.expand_as(tother))
    same(x.broadcast_to((2, 3, 3)), tx.broadcast_to((2, 3, 3)))
    first, second = em.broadcast_tensors(x, other[0, 0])
    tfirst, tsecond = torch.broadcast_tensors(tx, tother[0, 0])
    same(first, tfirst)
    same(second, tsecond)
    scalar, tscalar = pair(np.array(4.0, dtype=np.float32), device)
    same(scalar.expand(2, 3), tscalar.expand(2, 3))
    # expand then reshape: the expanded values are read through index math, not copied
    same(x.expand(3, 4).reshape(2, 6), tx.expand(3, 4).reshape(2, 6))
    same(x.expand(3, 4).T.reshape(-1), tx.expand(3, 4).T.reshape(-1))
    same.verify()


def test_repeat_and_repeat_interleave(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((2, 3)), device)
    same(x.repeat(2, 3), tx.repeat(2, 3))
    same(x.repeat(2, 1, 1), tx.repeat(2, 1, 1))
    same(x.repeat(0, 2), tx.repeat(0, 2))
    same(x.T.repeat(1, 2), tx.T.repeat(1, 2))
    same(x.repeat_interleave(2), tx.repeat_interleave(2))
    same(x.repeat_interleave(3, dim=1), tx.repeat_interleave(3, dim=1))
    same(x.repeat_interleave(2, dim=-2), tx.repeat_interleave(2, dim=-2))
    same(x.repeat_interleave(0, dim=0), tx.repeat_interleave(0, dim=0))
    counts, tcounts = pair(np.array([2, 0, 3], dtype=np.int64), device)
    same(x.repeat_interleave(counts, dim=1), tx.repeat_interleave(tcounts, dim=1))
    same(x.repeat_interleave(counts, dim=1, output_size=5), tx.repeat_interleave(tcounts, dim=1, output_size=5))
    same(em.repeat_interleave(x[0], counts), torch.repeat_interleave(tx[0], tcounts))
    one, tone = pair(np.array([2], dtype=np.int64), device)
    same(x.repeat_interleave(one, dim=0), tx.repeat_interleave(tone, dim=0))
    same.verify()


def test_flip(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 1, 17)), device)
    same(x.flip(0), tx.flip(0))
    same(x.flip(-1, 0), tx.flip(-1, 0))
    same(x.flip((0, 1, 2)), tx.flip((0, 1, 2)))
    same(x.permute(2, 0, 1).flip(1), tx.permute(2, 0, 1).flip(1))
    same(em.flip(x, [2]), torch.flip(tx, [2]))
    empty, tempty = pair(random_array((0, 3)), device)
    same(empty.flip(0, 1), tempty.flip(0, 1))
    same.verify()


def test_pad_constant(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17)), device)
    same(x.pad((1, 2)), F.pad(tx, (1, 2)))
    same(x.pad((0, 1, 3, 0), value=2.5), F.pad(tx, (0, 1, 3, 0), value=2.5))
    same(x.pad((-1, 2, 1, -2)), F.pad(tx, (-1, 2, 1, -2)))  # negative amounts crop
    same(x.pad((-17, 0)), F.pad(tx, (-17, 0)))
    same(x[None].pad((0, 0, 0, 0, 1, 1)), F.pad(tx[None], (0, 0, 0, 0, 1, 1)))
    same(x.T.pad((2, 0)), F.pad(tx.T, (2, 0)))
    integers, tintegers = pair(random_array((3, 3), np.int64), device)
    same(integers.pad((1, 1, 1, 1), value=-7), F.pad(tintegers, (1, 1, 1, 1), value=-7))
    flags, tflags = pair(random_array((3,), np.bool_), device)
    same(flags.pad((2, 1), value=True), F.pad(tflags, (2, 1), value=True))
    halves, thalves = pair(random_array((3,), np.float16), device)
    same(halves.pad((1, 1), value=1.5), F.pad(thalves, (1, 1), value=1.5))
    empty, tempty = pair(random_array((0, 2)), device)
    same(empty.pad((1, 1, 1, 1)), F.pad(tempty, (1, 1, 1, 1)))
    same.verify()


def test_pad_modes(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((2, 3, 5)), device)
    for mode in ("reflect", "replicate", "circular"):
        same(x.pad((2, 1), mode=mode), F.pad(tx, (2, 1), mode=mode))
        same(x.pad((1, 0, 2, 2), mode=mode), F.pad(tx, (1, 0, 2, 2), mode=mode))
        same(x.transpose(1, 2).pad((0, 2), mode=mode), F.pad(tx.transpose(1, 2), (0, 2), mode=mode))
    same.verify()


def test_narrow_select_roll(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 17)), device)
    same(x.narrow(1, 2, 5), tx.narrow(1, 2, 5))
    same(x.narrow(0, -2, 2), tx.narrow(0, -2, 2))
    same(x.narrow(1, 17, 0), tx.narrow(1, 17, 0))
    same(x.narrow(-1, 0, 17), tx.narrow(-1, 0, 17))
    same(em.narrow(x, 0, 1, 1), torch.narrow(tx, 0, 1, 1))
    same(x.select(1, -1), tx.select(1, -1))
    same(em.select(x, 0, 2), torch.select(tx, 0, 2))
    same(x.roll(3, 1), tx.roll(3, 1))
    same(x.roll(-4, -1), tx.roll(-4, -1))
    same(x.roll(20, 1), tx.roll(20, 1))
    same(x.roll((1, 2), (0, 1)), tx.roll((1, 2), (0, 1)))
    same(x.roll(5), tx.roll(5))
    same(x.roll(0, 0), tx.roll(0, 0))
    same.verify()


def test_cat_and_stack(device: str) -> None:
    same = BatchedChecks()
    a, ta = pair(random_array((2, 3)), device)
    b, tb = pair(random_array((2, 17), seed=1), device)
    c, tc = pair(random_array((2, 1), seed=2), device)
    same(em.cat([a, b, c], 1), torch.cat([ta, tb, tc], 1))
    same(em.cat((a, b), dim=-1), torch.cat((ta, tb), dim=-1))
    same(em.cat([a, a.flip(0)]), torch.cat([ta, ta.flip(0)]))
    same(em.concat([a.T, c.T]), torch.concat([ta.T, tc.T]))
    same(em.cat([a]), torch.cat([ta]))
    same(a.cat([a], 0), torch.cat([ta, ta], 0))
    empty, tempty = pair(random_array((2, 0)), device)
    same(em.cat([empty, a, empty], 1), torch.cat([tempty, ta, tempty], 1))
    legacy, tlegacy = pair(random_array((0,)), device)
    same(em.cat([a, legacy]), torch.cat([ta, tlegacy]))
    integers, tintegers = pair(random_array((2, 3), np.int32), device)
    same(em.cat([integers, a]), torch.cat([tintegers, ta]))  # promoted to float32
    flags, tflags = pair(random_array((2, 3), np.bool_), device)
    same(em.cat([flags, flags.logical_not()]), torch.cat([tflags, tflags.logical_not()]))
    same(em.cat([flags, integers], 1), torch.cat([tflags, tintegers], 1))
    same(em.stack([a, a * 2, a.flip(1)]), torch.stack([ta, ta * 2, ta.flip(1)]))
    same(em.stack([a, a], dim=-1), torch.stack([ta, ta], dim=-1))
    same(em.stack([a, a], 1), torch.stack([ta, ta], 1))
    scalar, tscalar = pair(np.array(3.0, dtype=np.float32), device)
    same(em.stack([scalar, scalar + 1]), torch.stack([tscalar, tscalar + 1]))
    same.verify()


def test_a_join_of_hundreds_of_parts_reads_a_few_parts_a_kernel_and_matches_torch(device: str, monkeypatch) -> None:
    """A cat of 300 parts of mixed sizes (and a stack of 300, as an RNN's outputs are stacked): no kernel reads more
    than JOIN_GROUP parts (one kernel of all parts read each of them through a mask for every element: a stack of
    512 tensors of 64 x 128 took 0.73 s, torch's 2 ms); values, bools, integers and gradients are torch's."""
    from ember.core.movement import JOIN_GROUP
    from tests.helpers import scheduled_launches

    generator = np.random.default_rng(5)
    arrays = [generator.standard_normal((3, int(generator.integers(1, 4)), 5)).astype(np.float32) for _ in range(300)]
    arrays[7][0, 0, 0], arrays[299][2, 0, 4] = np.nan, -0.0
    parts = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
    references = [torch.tensor(array, requires_grad=True) for array in arrays]
    joined = em.cat(parts, 1)
    launches = scheduled_launches(joined.realize, monkeypatch)
    assert JOIN_GROUP <= 16 and launches and max(len(launch.inputs) for launch in launches) <= JOIN_GROUP
    same(joined, torch.cat(references, 1))
    same(em.stack([part[:, :1] for part in parts[::3]], -1), torch.stack([part[:, :1] for part in references[::3]], -1))
    flags = [em.tensor(array > 0, device=device) for array in arrays]
    same(em.cat(flags, 1), torch.cat([torch.from_numpy(array > 0) for array in arrays], 1))
    counts = [em.tensor(array.astype(np.int64), device=device) for array in arrays[:20]]
    same(em.cat(counts, 1), torch.cat([torch.from_numpy(array.astype(np.int64)) for array in arrays[:20]], 1))
    weights = generator.standard_normal(torch.cat(references, 1).shape).astype(np.float32)
    (em.cat(parts, 1) * em.tensor(weights, device=device)).sum().backward()
    (torch.cat(references, 1) * torch.from_numpy(weights)).sum().backward()
    for part, reference in zip(parts, references):
        same(part.grad, reference.grad)


def test_a_join_at_a_users_size_matches_numpy_exactly() -> None:
    """600 rows of 70,001 floats (past 65,535; 4.2 * 10^7 values, four levels of joins) stacked, and 40 of them
    joined along their long dim, with NaN, infinities and -0.0: numpy's values exactly (one computation each)."""
    generator = np.random.default_rng(11)
    rows = generator.standard_normal((600, 70_001)).astype(np.float32)
    rows[0, 0], rows[299, 70_000], rows[599, 12345], rows[450, 7] = np.nan, np.inf, -np.inf, -0.0
    parts = [em.tensor(row, device="c") for row in rows]
    stacked = em.stack(parts).numpy()
    np.testing.assert_array_equal(stacked, rows)
    assert np.signbit(stacked[450, 7])
    np.testing.assert_array_equal(em.cat(parts[:40]).numpy(), rows[:40].reshape(-1))


def test_cat_keeps_special_values(device: str) -> None:
    special, tspecial = pair(np.array([np.inf, -np.inf, np.nan, 1.0], dtype=np.float32), device)
    same(em.cat([special, special.flip(0)]), torch.cat([tspecial, tspecial.flip(0)]))


def test_split_chunk_unbind_tensor_split(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((17, 3)), device)
    same(x.split(5), tx.split(5))
    same(x.split([2, 0, 15]), tx.split([2, 0, 15]))
    same(x.split(2, dim=1), tx.split(2, dim=1))
    same(x.split(17), tx.split(17))
    same(x.chunk(4), tx.chunk(4))
    same(x.chunk(3, dim=-1), tx.chunk(3, dim=-1))
    same(x.chunk(20), tx.chunk(20))
    same(x.unbind(1), tx.unbind(1))
    same(x.tensor_split(3), tx.tensor_split(3))
    same(x.tensor_split([1, 5, 30]), tx.tensor_split([1, 5, 30]))
    same(x.tensor_split([4, 2]), tx.tensor_split([4, 2]))
    same(x.T.unbind(), tx.T.unbind())
    same(em.split(x, 8), torch.split(tx, 8))
    same(em.chunk(x, 2, 1), torch.chunk(tx, 2, 1))
    same(em.unbind(x[:2]), torch.unbind(tx[:2]))
    same(list(x[:3]), list(tx[:3]))  # iteration unbinds dim 0
    empty, tempty = pair(random_array((0, 3)), device)
    same(empty.split(2), tempty.split(2))
    same(empty.chunk(3), tempty.chunk(3))
    assert empty.unbind() == () and tempty.unbind() == ()
    same.verify()


def test_movement_chains_keep_values(device: str) -> None:
    same = BatchedChecks()
    x, tx = pair(random_array((3, 4, 5)), device)
    # pad after permute
    same(x.permute(2, 0, 1).pad((1, 2, 0, 1)), F.pad(tx.permute(2, 0, 1), (1, 2, 0, 1)))
    # reshape after shrink (not contiguous)
    same(x[1:, 1:3].reshape(4, 5), tx[1:, 1:3].reshape(4, 5))
    same(x[:, ::2, 1:4].reshape(-1, 2), tx[:, ::2, 1:4].reshape(-1, 2))
    # flip of padded
    same(x.pad((2, 0, 0, 1), value=-1.0).flip(1, 2), F.pad(tx, (2, 0, 0, 1), value=-1.0).flip(1, 2))
    # expand then reshape, then permute and shrink
    y, ty = pair(random_array((3, 1, 5)), device)
    same(y.expand(3, 4, 5).reshape(12, 5).T[1:4], ty.expand(3, 4, 5).reshape(12, 5).T[1:4])
    # a long chain
    chain = x.transpose(0, 2).flip(0).pad((1, 1, 0, 0, 0, 2))[1:, :, ::2].reshape(6, -1).unsqueeze(1).expand(6, 2, 12)
    tchain = F.pad(tx.transpose(0, 2).flip(0), (1, 1, 0, 0, 0, 2))[1:, :, ::2].reshape(6, -1).unsqueeze(1).expand(
        6, 2, 12
    )
    same(chain, tchain)
    same(chain.reshape(-1)[::5], tchain.reshape(-1)[::5])
    same.verify()


def test_movement_chain_between_elementwise_ops_is_one_kernel(device: str) -> None:
    x, tx = pair(random_array((4, 6)), device)
    y = ((x * 2).reshape(3, 8).permute(1, 0).pad((1, 0, 2, 2))[1:11].flip(0, 1)[::2].reshape(-1, 2) + 1).exp()
    ty = (F.pad((tx * 2).reshape(3, 8).permute(1, 0), (1, 0, 2, 2))[1:11].flip(0, 1)[::2].reshape(-1, 2) + 1).exp()
    assert count_kernels(y) == 1
    assert_close(y, ty)
    pure = x.T.pad((1, 1)).flip(0).reshape(-1)[2:30].reshape(4, 7).sqrt()
    tpure = F.pad(tx.T, (1, 1)).flip(0).reshape(-1)[2:30].reshape(4, 7).sqrt()
    assert count_kernels(pure) == 1
    assert_close(pure, tpure)
    # cat and stack are pads and adds: they fuse into the consumer too
    joined = em.cat([x, x.flip(0) * 3], 1).relu()
    assert count_kernels(joined) == 1
    same(joined, torch.cat([tx, tx.flip(0) * 3], 1).relu())


def test_movement_on_several_dtypes(device: str) -> None:
    same = BatchedChecks()
    for dtype in (np.int8, np.uint8, np.int64, np.float64, np.bool_):
        x, tx = pair(random_array((3, 4), dtype), device)
        same(x.T.flip(0).pad((1, 0)).reshape(2, 8), F.pad(tx.T.flip(0), (1, 0)).reshape(2, 8))
        same(em.cat([x, x[:1]]), torch.cat([tx, tx[:1]]))
    same.verify()


def test_movement_errors_name_the_shapes(device: str) -> None:
    x = em.zeros(2, 3, device=device)
    with pytest.raises(em.ShapeError, match=r"\(4, 2\).*\(2, 3\)"):
        x.reshape(4, 2)
    with pytest.raises(em.ShapeError, match="only one dimension can be -1"):
        x.reshape(-1, -1)
    with pytest.raises(em.ShapeError, match=r"expand.*dim 1.*from 3 to 4.*\(2, 3\)"):
        x.expand(2, 4)
    with pytest.raises(em.ShapeError, match="fewer dims"):
        x.expand(3)
    with pytest.raises(em.ShapeError, match="-1 is not allowed"):
        x.expand(-1, 2, 3)
    with pytest.raises(em.ShapeError, match=r"permutation.*\(2, 3\)"):
        x.permute(0, 0)
    with pytest.raises(em.ShapeError, match=r"has 3 dims.*\(2, 3\)"):
        x.permute(0, 1, 2)
    with pytest.raises(em.AxisError, match=r"dim 2 is out of range.*rank 2"):
        x.transpose(0, 2)
    with pytest.raises(em.ArgumentError, match="repeats"):
        x.flip(0, 0)
    with pytest.raises(em.ShapeError, match=r"crop more.*\(2, 3\)"):
        x.pad((-4, 0))
    with pytest.raises(em.ShapeError, match="even length"):
        x.pad((1,))
    with pytest.raises(em.ShapeError, match=r"must be at most 2.*size 3"):
        x.pad((3, 0), mode="reflect")
    with pytest.raises(ValueError, match="unknown mode"):
        x.pad((1, 1), mode="wrap")
    with pytest.raises(em.ShapeError, match=r"repeat.*\(2, 3\)"):
        x.repeat(2)
    with pytest.raises(em.ShapeError, match=r"sum to 2.*\(2, 3\)"):
        x.split([1, 2])
    with pytest.raises(ValueError, match="split_size must be positive"):
        x.split(0)
    with pytest.raises(IndexError, match="start 3 is out of range"):
        x.narrow(0, 3, 0)
    with pytest.raises(em.ShapeError, match=r"length 3 does not fit.*size 3"):
        x.narrow(1, 1, 3)
    with pytest.raises(em.ShapeError, match="mT needs"):
        _ = em.zeros(3, device=device).mT
    with pytest.raises(em.ShapeError, match=r"t\(\) expects"):
        em.zeros(1, 2, 3, device=device).t()
    with pytest.raises(em.ShapeError, match=r"cat: the shapes must match in every dim except dim 0: the tensor at "
                                            r"position 1 has shape \(3, 2\), the first \(2, 3\)"):
        em.cat([x, x.T])
    with pytest.raises(em.ShapeError, match=r"position 1 has shape \(3,\), the first \(2, 3\)"):
        em.cat([x, em.zeros(3, device=device)])
    with pytest.raises(em.ShapeError, match="zero-dimensional"):
        em.cat([em.tensor(1.0, device=device)])
    with pytest.raises(ValueError, match="non-empty"):
        em.stack([])
    with pytest.raises(em.ShapeError, match=r"same shape: the tensor at position 1 has shape \(3, 2\), the first "
                                            r"\(2, 3\)"):
        em.stack([x, x.T])
    with pytest.raises(em.ShapeError, match="one count per element"):
        x.repeat_interleave(em.tensor([1, 2], device=device), dim=1)
    with pytest.raises(TypeError, match="shape of integers"):
        x.reshape(2.0, 3)


def test_negative_zero_survives_pad_and_cat(device: str) -> None:
    values = em.tensor([-0.0, 1.0], device=device)
    assert np.signbit(values.pad((1, 0), value=-0.0).numpy()).tolist() == [True, True, False]
    assert np.signbit(em.cat([values, values]).numpy()).tolist() == [True, False, True, False]
