"""ember.models: pretrained models built from ember.nn layers (BERT sentence embeddings)."""

from ember.models.bert import BertConfig, BertModel, SentenceEncoder, load_minilm, mean_pool

__all__ = ["BertConfig", "BertModel", "SentenceEncoder", "load_minilm", "mean_pool"]
