"""ember.models: pretrained models built from ember.nn layers (BERT sentence embeddings; decoders from GGUF files)."""

from ember.models.bert import BertConfig, BertModel, SentenceEncoder, load_minilm, mean_pool
from ember.models.decoder import ARCHITECTURES, Decoder, DecoderConfig

__all__ = ["ARCHITECTURES", "BertConfig", "BertModel", "Decoder", "DecoderConfig", "SentenceEncoder", "load_minilm",
           "mean_pool"]
