"""ember.nn.utils against torch.nn.utils: gradient clipping, parameter vectors, packed sequences through RNN/LSTM/GRU,
parametrizations (weight_norm, spectral_norm) old and new, and the parity report's sections for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.rnn as torch_rnn

import ember as em
import ember.nn as enn
import ember.nn.utils.rnn as ember_rnn
from ember.nn.utils import parametrize
from tests.helpers import assert_close

GRAD_SHAPES = [(4, 3), (7,), (2, 2, 5)]


def _parameters_with_grads(device: str, scale: float) -> tuple[list[em.Tensor], list[torch.Tensor]]:
    generator = np.random.default_rng(3)
    ember_parameters, torch_parameters = [], []
    for shape in GRAD_SHAPES:
        value = generator.normal(size=shape).astype(np.float32)
        grad = (generator.normal(size=shape) * scale).astype(np.float32)
        ember_parameter = enn.Parameter(em.tensor(value, device=device))
        ember_parameter.grad = em.tensor(grad, device=device)
        torch_parameter = torch.nn.Parameter(torch.tensor(value))
        torch_parameter.grad = torch.tensor(grad)
        ember_parameters.append(ember_parameter)
        torch_parameters.append(torch_parameter)
    return ember_parameters, torch_parameters


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), "inf"])
@pytest.mark.parametrize("scale", [0.1, 10.0])  # below max_norm (the grads stay) and above it (they shrink)
def test_clip_grad_norm_matches_torch(norm_type: float | str, scale: float, device: str) -> None:
    ember_parameters, torch_parameters = _parameters_with_grads(device, scale)
    total = enn.utils.clip_grad_norm_(ember_parameters, max_norm=1.5, norm_type=norm_type)
    torch_total = torch.nn.utils.clip_grad_norm_(torch_parameters, max_norm=1.5, norm_type=norm_type)
    assert isinstance(total, em.Tensor) and total.shape == ()
    assert_close(total, torch_total, atol=1e-4)
    for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
        assert_close(ember_parameter.grad, torch_parameter.grad, atol=1e-6)
        assert_close(ember_parameter, torch_parameter.detach())  # clipping touches only the gradients


def test_clip_grad_norm_is_one_template_copy_with_torchs_values(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2-norm clip of many gradients (a training step's clip_grad_norm_) is recorded as one template's copy from
    its second call on, no op recorded one by one: three calls of three scales (shrinking and not), gradients that
    are views and lazy values, torch's norms and gradients each time, and the gradients' versions advance as mul_'s
    do."""
    import ember.core.tensor as tensor_module
    from ember.core.graph_templates import TEMPLATES

    recorded: list[object] = []  # ops recorded one by one, but for the view's write into its base (views.py)
    writing = []
    apply, write_through = em.Tensor._apply, tensor_module.write_through

    def counted(self: em.Tensor, *args: object, **kwargs: object) -> em.Tensor:
        if not writing:
            recorded.append(args[0])
        return apply(self, *args, **kwargs)

    def written(*args: object) -> em.Tensor:
        writing.append(1)
        try:
            return write_through(*args)
        finally:
            writing.pop()

    monkeypatch.setattr(em.Tensor, "_apply", counted)
    monkeypatch.setattr(tensor_module, "write_through", written)
    for scale in (10.0, 0.1, 10.0):
        ember_parameters, torch_parameters = _parameters_with_grads(device, scale)
        ember_parameters[1].grad = ember_parameters[1].grad * 1.0  # (a lazy value)
        base = em.tensor(np.zeros((2, 7), np.float32), device=device)
        base[0] = ember_parameters[1].grad
        ember_parameters[1].grad = base[0]  # (a view: the clip writes through it into `base`)
        versions = [parameter.grad._version for parameter in ember_parameters]
        copies = TEMPLATES.instantiated
        recorded.clear()
        total = enn.utils.clip_grad_norm_(ember_parameters, max_norm=1.5)
        if scale == 0.1:
            assert TEMPLATES.instantiated == copies + 1 and not recorded, recorded
        torch_total = torch.nn.utils.clip_grad_norm_(torch_parameters, max_norm=1.5)
        assert_close(total, torch_total, atol=1e-4)
        for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
            assert_close(ember_parameter.grad, torch_parameter.grad, atol=1e-6)
        assert_close(base[0], torch_parameters[1].grad, atol=1e-6)
        assert [parameter.grad._version for parameter in ember_parameters] == [version + 1 for version in versions]


def test_clip_grad_norm_of_a_parameter_listed_twice_is_torchs(device: str) -> None:
    """A parameter listed twice counts twice in the norm and is scaled twice, as torch's loop of mul_ does."""
    ember_parameters, torch_parameters = _parameters_with_grads(device, 10.0)
    total = enn.utils.clip_grad_norm_([*ember_parameters, ember_parameters[0]], max_norm=1.5)
    torch_total = torch.nn.utils.clip_grad_norm_([*torch_parameters, torch_parameters[0]], max_norm=1.5)
    assert_close(total, torch_total, atol=1e-4)
    for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
        assert_close(ember_parameter.grad, torch_parameter.grad, atol=1e-6)


def test_get_total_norm_clip_grads_with_norm_and_clip_grad_value(device: str) -> None:
    ember_parameters, torch_parameters = _parameters_with_grads(device, 3.0)
    total = enn.utils.get_total_norm([p.grad for p in ember_parameters], 2.0)
    torch_total = torch.nn.utils.get_total_norm([p.grad for p in torch_parameters], 2.0)
    assert_close(total, torch_total, atol=1e-4)
    enn.utils.clip_grads_with_norm_(ember_parameters, 2.0, total)
    torch.nn.utils.clip_grads_with_norm_(torch_parameters, 2.0, torch_total)
    enn.utils.clip_grad_value_(ember_parameters, 0.3)
    torch.nn.utils.clip_grad_value_(torch_parameters, 0.3)
    for ember_parameter, torch_parameter in zip(ember_parameters, torch_parameters):
        assert_close(ember_parameter.grad, torch_parameter.grad, atol=1e-6)
    assert_close(enn.utils.get_total_norm([]), torch.nn.utils.get_total_norm([]))


def test_clip_grad_norm_nonfinite(device: str) -> None:
    parameter = enn.Parameter(em.ones(3, device=device))
    parameter.grad = em.tensor([1.0, float("inf"), 2.0], device=device)
    with pytest.raises(RuntimeError, match="non-finite, so it cannot be clipped"):
        enn.utils.clip_grad_norm_([parameter], 1.0, error_if_nonfinite=True)
    torch_parameter = torch.nn.Parameter(torch.ones(3))
    torch_parameter.grad = torch.tensor([1.0, float("inf"), 2.0])
    assert_close(enn.utils.clip_grad_norm_([parameter], 1.0), torch.nn.utils.clip_grad_norm_([torch_parameter], 1.0))
    assert_close(parameter.grad, torch_parameter.grad)


def test_parameters_to_vector_and_back(device: str) -> None:
    torch.manual_seed(0)
    torch_model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model = enn.Sequential(enn.Linear(3, 4), enn.Linear(4, 2)).to(device)
    model.load_state_dict(torch_model.state_dict())
    vector = enn.utils.parameters_to_vector(model.parameters())
    torch_vector = torch.nn.utils.parameters_to_vector(torch_model.parameters())
    assert_close(vector, torch_vector)
    weights = np.random.default_rng(0).normal(size=tuple(torch_vector.shape)).astype(np.float32)
    (vector * em.tensor(weights, device=device)).sum().backward()
    (torch_vector * torch.tensor(weights)).sum().backward()
    for parameter, torch_parameter in zip(model.parameters(), torch_model.parameters()):
        assert_close(parameter.grad, torch_parameter.grad)
    new = np.arange(torch_vector.numel(), dtype=np.float32)
    enn.utils.vector_to_parameters(em.tensor(new, device=device), model.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(new), torch_model.parameters())
    for parameter, torch_parameter in zip(model.parameters(), torch_model.parameters()):
        assert_close(parameter, torch_parameter.detach())
    assert_close(vector, torch_vector.detach())  # the vector taken before is a copy, not a view of the parameters


LENGTHS = [3, 6, 1, 4, 6]


@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_pad_round_trips_and_gradients(batch_first: bool, device: str) -> None:
    shape = (len(LENGTHS), 6, 3) if batch_first else (6, len(LENGTHS), 3)
    array = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    ember_input = em.tensor(array, device=device, requires_grad=True)
    torch_input = torch.tensor(array, requires_grad=True)
    packed = ember_rnn.pack_padded_sequence(ember_input, LENGTHS, batch_first=batch_first, enforce_sorted=False)
    torch_packed = torch_rnn.pack_padded_sequence(torch_input, torch.tensor(LENGTHS), batch_first, False)
    assert_close(packed.data, torch_packed.data)
    assert_close(packed.batch_sizes, torch_packed.batch_sizes)
    assert_close(packed.sorted_indices, torch_packed.sorted_indices)
    assert_close(packed.unsorted_indices, torch_packed.unsorted_indices)
    padded, lengths = ember_rnn.pad_packed_sequence(packed, batch_first, padding_value=-2.0, total_length=7)
    torch_padded, torch_lengths = torch_rnn.pad_packed_sequence(torch_packed, batch_first, -2.0, 7)
    assert_close(padded, torch_padded)
    assert_close(lengths, torch_lengths)
    weights = np.random.default_rng(2).normal(size=tuple(torch_padded.shape)).astype(np.float32)
    (padded * em.tensor(weights, device=device)).sum().backward()
    (torch_padded * torch.tensor(weights)).sum().backward()
    assert_close(ember_input.grad, torch_input.grad)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        ember_rnn.pack_padded_sequence(ember_input, LENGTHS, batch_first=batch_first)


def test_pad_sequence_pack_sequence_unpack_unpad(device: str) -> None:
    generator = np.random.default_rng(4)
    arrays = [generator.normal(size=(length, 2)).astype(np.float32) for length in LENGTHS]
    sequences = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
    torch_sequences = [torch.tensor(array, requires_grad=True) for array in arrays]
    for batch_first in (False, True):
        for side in ("right", "left"):
            assert_close(
                ember_rnn.pad_sequence(sequences, batch_first, 1.5, side),
                torch_rnn.pad_sequence(torch_sequences, batch_first, 1.5, side),
            )
    packed = ember_rnn.pack_sequence(sequences, enforce_sorted=False)
    torch_packed = torch_rnn.pack_sequence(torch_sequences, enforce_sorted=False)
    assert_close(packed.data, torch_packed.data)
    assert_close(ember_rnn.unpack_sequence(packed), torch_rnn.unpack_sequence(torch_packed))
    padded = ember_rnn.pad_sequence(sequences, batch_first=True)
    torch_padded = torch_rnn.pad_sequence(torch_sequences, batch_first=True)
    assert_close(ember_rnn.unpad_sequence(padded, LENGTHS, batch_first=True),
                 torch_rnn.unpad_sequence(torch_padded, torch.tensor(LENGTHS), batch_first=True))
    (packed.data * packed.data).sum().backward()
    (torch_packed.data * torch_packed.data).sum().backward()
    assert_close([sequence.grad for sequence in sequences], [sequence.grad for sequence in torch_sequences])


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_recurrent_layers_on_packed_batches(kind: str, device: str) -> None:
    torch.manual_seed(0)
    torch_module = getattr(torch.nn, kind)(3, 4, 2, bidirectional=True, batch_first=True)
    module = getattr(enn, kind)(3, 4, 2, bidirectional=True, batch_first=True).to(device)
    module.load_state_dict(torch_module.state_dict())
    generator = np.random.default_rng(5)
    array = generator.normal(size=(len(LENGTHS), 6, 3)).astype(np.float32)
    hidden = generator.normal(size=(4, len(LENGTHS), 4)).astype(np.float32)
    ember_input = em.tensor(array, device=device, requires_grad=True)
    torch_input = torch.tensor(array, requires_grad=True)
    ember_hx: object = em.tensor(hidden, device=device)
    torch_hx: object = torch.tensor(hidden)
    if kind == "LSTM":
        ember_hx, torch_hx = (ember_hx, em.tensor(hidden * 0.5, device=device)), (torch_hx, torch.tensor(hidden * 0.5))
    packed = ember_rnn.pack_padded_sequence(ember_input, LENGTHS, batch_first=True, enforce_sorted=False)
    torch_packed = torch_rnn.pack_padded_sequence(torch_input, LENGTHS, batch_first=True, enforce_sorted=False)
    output, state = module(packed, ember_hx)
    torch_output, torch_state = torch_module(torch_packed, torch_hx)
    assert isinstance(output, ember_rnn.PackedSequence)
    assert_close(output.data, torch_output.data, atol=1e-5)
    padded, _ = ember_rnn.pad_packed_sequence(output, batch_first=True)
    torch_padded, _ = torch_rnn.pad_packed_sequence(torch_output, batch_first=True)
    assert_close(padded, torch_padded, atol=1e-5)
    states = list(state) if kind == "LSTM" else [state]
    torch_states = list(torch_state) if kind == "LSTM" else [torch_state]
    assert_close(states, torch_states, atol=1e-5)  # each sequence's state at its own length
    weights = generator.normal(size=tuple(torch_padded.shape)).astype(np.float32)
    ((padded * em.tensor(weights, device=device)).sum() + sum((s * s).sum() for s in states)).backward()
    ((torch_padded * torch.tensor(weights)).sum() + sum((s * s).sum() for s in torch_states)).backward()
    assert_close(ember_input.grad, torch_input.grad, atol=1e-4)
    for parameter, torch_parameter in zip(module.parameters(), torch_module.parameters()):
        assert_close(parameter.grad, torch_parameter.grad, atol=1e-4)


def _linear_pair(device: str, make: type = enn.Linear, torch_make: type = torch.nn.Linear,
                 shape: tuple[int, ...] = (5, 4)) -> tuple[enn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    torch_module = torch_make(*shape)
    module = make(*shape).to(device)
    module.load_state_dict(torch_module.state_dict())
    return module, torch_module


def _forward_backward(module: enn.Module, torch_module: torch.nn.Module, device: str, shape: tuple[int, ...]) -> None:
    array = np.random.default_rng(6).normal(size=shape).astype(np.float32)
    output, torch_output = module(em.tensor(array, device=device)), torch_module(torch.tensor(array))
    assert_close(output, torch_output, atol=1e-5)
    (output * output).sum().backward()
    (torch_output * torch_output).sum().backward()
    torch_parameters = dict(torch_module.named_parameters())
    assert list(dict(module.named_parameters())) == list(torch_parameters)
    for name, parameter in module.named_parameters():
        assert_close(parameter.grad, torch_parameters[name].grad, atol=1e-4)


@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_parametrization_and_hook(dim: int | None, device: str) -> None:
    module, torch_module = _linear_pair(device)
    enn.utils.parametrizations.weight_norm(module, dim=dim)
    torch.nn.utils.parametrizations.weight_norm(torch_module, dim=dim)
    assert parametrize.is_parametrized(module, "weight") and type(module).__name__ == "ParametrizedLinear"
    assert list(module.state_dict()) == list(torch_module.state_dict())
    assert_close(module.weight, torch_module.weight, atol=1e-6)
    _forward_backward(module, torch_module, device, (3, 5))
    parametrize.remove_parametrizations(module, "weight")
    torch.nn.utils.parametrize.remove_parametrizations(torch_module, "weight")
    assert type(module) is enn.Linear and list(module.state_dict()) == list(torch_module.state_dict())
    assert_close(module.weight, torch_module.weight.detach(), atol=1e-6)

    module, torch_module = _linear_pair(device)
    with pytest.warns(FutureWarning):
        enn.utils.weight_norm(module, dim=dim)
    with pytest.warns(FutureWarning):
        torch.nn.utils.weight_norm(torch_module, dim=dim)
    assert list(module.state_dict()) == list(torch_module.state_dict())
    _forward_backward(module, torch_module, device, (3, 5))
    enn.utils.remove_weight_norm(module)
    torch.nn.utils.remove_weight_norm(torch_module)
    assert_close(module.weight, torch_module.weight.detach(), atol=1e-6)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found"):
        enn.utils.remove_weight_norm(module)


def _copy_buffers(module: enn.Module, torch_module: torch.nn.Module, device: str) -> None:
    for name, buffer in torch_module.named_buffers():
        module.get_buffer(name).data = em.tensor(buffer.numpy(), device=device)


@pytest.mark.parametrize("api", ["parametrizations", "hook"])
def test_spectral_norm_matches_torch_from_the_same_vectors(api: str, device: str) -> None:
    module, torch_module = _linear_pair(device, enn.Conv2d, torch.nn.Conv2d, (2, 3, 3))
    if api == "hook":
        enn.utils.spectral_norm(module)
        torch.nn.utils.spectral_norm(torch_module)
    else:
        enn.utils.parametrizations.spectral_norm(module)
        torch.nn.utils.parametrizations.spectral_norm(torch_module)
    assert list(module.state_dict()) == list(torch_module.state_dict())
    _copy_buffers(module, torch_module, device)
    for _ in range(2):  # each training-mode forward advances the power iteration
        module.zero_grad(), torch_module.zero_grad()
        _forward_backward(module, torch_module, device, (2, 2, 5, 5))
        for name, buffer in torch_module.named_buffers():
            assert_close(module.get_buffer(name), buffer, atol=1e-5)
    module.eval(), torch_module.eval()
    _forward_backward(module, torch_module, device, (2, 2, 5, 5))
    torch_weight = torch_module.weight.detach()
    if api == "hook":
        enn.utils.remove_spectral_norm(module)
        torch.nn.utils.remove_spectral_norm(torch_module)
    else:
        parametrize.remove_parametrizations(module, "weight")
        torch.nn.utils.parametrize.remove_parametrizations(torch_module, "weight")
    assert list(module.state_dict()) == list(torch_module.state_dict())
    assert_close(module.weight, torch_weight, atol=1e-5)


def test_spectral_norm_properties(device: str) -> None:
    module = enn.utils.parametrizations.spectral_norm(enn.Linear(6, 4).to(device))
    weight = module.weight.numpy()
    assert abs(np.linalg.svd(weight, compute_uv=False)[0] - 1.0) < 1e-3  # 15 initial power steps converge here
    values = np.array([3.0, -4.0, 0.5, 2.0], dtype=np.float32)  # a 1-d tensor is normalized exactly (no iteration)
    vector_module = enn.utils.parametrizations.spectral_norm(enn.Linear(1, 4).to(device), name="bias")
    vector_module.parametrizations.bias.original.data = em.tensor(values, device=device)
    assert_close(vector_module.bias, torch.nn.functional.normalize(torch.tensor(values), dim=0))


def test_register_parametrization_mechanism(device: str) -> None:
    class Symmetric(enn.Module):
        def forward(self, x: em.Tensor) -> em.Tensor:
            return x.triu() + x.triu(1).transpose(0, 1)

    class TorchSymmetric(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.triu() + x.triu(1).transpose(0, 1)

    module, torch_module = _linear_pair(device, shape=(3, 3))
    parametrize.register_parametrization(module, "weight", Symmetric())
    torch.nn.utils.parametrize.register_parametrization(torch_module, "weight", TorchSymmetric())
    assert list(module.state_dict()) == list(torch_module.state_dict())
    _forward_backward(module, torch_module, device, (2, 3))
    assert parametrize.type_before_parametrizations(module) is enn.Linear
    with pytest.raises(RuntimeError, match="does not implement right_inverse"):
        module.weight = em.zeros(3, 3, device=device)
    with pytest.raises(ValueError, match="does not have a parameter, a buffer"):
        parametrize.register_parametrization(module, "missing", Symmetric())
    with pytest.raises(ValueError, match="does not have a parametrization on bias"):
        parametrize.remove_parametrizations(module, "bias")
    parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
    assert type(module) is enn.Linear and not parametrize.is_parametrized(module)


def test_parity_report_has_the_new_sections() -> None:
    from ember.parity import format_report, report

    found = report()
    for title in ("torch.nn.utils functions", "torch.nn.utils.rnn names", "torch.nn.utils.parametrize names",
                  "torch.nn.utils.parametrizations names", "torch.utils.data names", "torch.nn.init functions",
                  "torch.optim.lr_scheduler classes"):
        assert title in found, title
        assert found[title]["count"] > 0
    utils_missing = [name for group in found["torch.nn.utils functions"]["missing"].values() for name in group]
    for name in ("clip_grad_norm_", "weight_norm", "spectral_norm", "parameters_to_vector"):
        assert name not in utils_missing
    assert found["torch.nn.utils.rnn names"]["missing"] == {"names": []}
    assert found["torch.nn.utils.parametrizations names"]["missing"] == {"names": ["orthogonal"]}
    data = found["torch.utils.data names"]
    assert data["count"] == 29 and data["present"] == data["count"] - len(data["missing"]["names"])
    text = format_report(found)
    assert "torch.nn.utils functions:" in text and "torch.optim.lr_scheduler classes:" in text


def test_clip_grad_norm_in_a_training_loop_is_replayed_with_torchs_values(device: str) -> None:
    """A training loop's clip_grad_norm_ is replayed from its third call on (clip_replay.py: the same kernels on the
    gradients' buffers, scaled in place): torch's gradients and norms at every step, each step's norm kept (a
    replay's is copied out of the capture's buffer), the gradients' versions advancing as mul_'s do, a gradient read
    by a lazy value kept from before the clip keeping its old value, and another max_norm clipped by its own
    signature."""
    from ember.nn.utils.clip_replay import REPLAYS

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = enn.Sequential(enn.Linear(6, 8), enn.Tanh(), enn.Linear(8, 3)).to(device)
    model.load_state_dict({name: value.detach().numpy() for name, value in reference.state_dict().items()})
    replayed = REPLAYS.replayed
    norms, torch_norms = [], []
    for step in range(6):
        values = np.random.default_rng(step).normal(size=(5, 6)).astype(np.float32) * (1 + step)
        model.zero_grad()
        reference.zero_grad()
        (model(em.tensor(values, device=device)) ** 2).sum().backward()
        (reference(torch.tensor(values)) ** 2).sum().backward()
        parameters = list(model.parameters())
        held = parameters[0].grad * 1.0  # (lazy: reads the gradient before the clip)
        versions = [parameter.grad._version for parameter in parameters]
        max_norm = 0.5 if step < 5 else 0.25
        norms.append(enn.utils.clip_grad_norm_(parameters, max_norm))
        torch_norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm))
        for parameter, torch_parameter in zip(parameters, reference.parameters()):
            assert_close(parameter.grad, torch_parameter.grad, atol=1e-5, rtol=1e-4)
        assert [parameter.grad._version for parameter in parameters] == [version + 1 for version in versions]
        expected_held = next(reference.parameters()).grad * torch_norms[-1].clamp(min=max_norm) / max_norm
        assert_close(held, expected_held, atol=1e-4, rtol=1e-4)
    for norm, torch_norm in zip(norms, torch_norms):
        assert_close(norm, torch_norm, atol=1e-4, rtol=1e-4)
    assert REPLAYS.replayed - replayed >= 2
