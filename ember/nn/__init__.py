"""ember.nn: layers (Modules) with PyTorch's names, parameters, state_dict keys and default initialization."""

from ember.nn import functional, init
from ember.nn.activation import (
    CELU, ELU, GELU, GLU, SELU, Hardshrink, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, LogSigmoid, LogSoftmax, Mish,
    PReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Softmin, Softplus, Softshrink, Softsign, Tanh, Tanhshrink, Threshold,
)
from ember.nn.attention import MultiheadAttention
from ember.nn.containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from ember.nn.conv import Conv1d, Conv2d
from ember.nn.dropout import Dropout, Dropout1d, Dropout2d
from ember.nn.linear import Bilinear, Flatten, Identity, Linear, Unflatten
from ember.nn.loss import (
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss,
)
from ember.nn.module import Module
from ember.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from ember.nn.parameter import Parameter
from ember.nn.pooling import AdaptiveAvgPool1d, AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d
from ember.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell
from ember.nn.sparse import Embedding
from ember.nn.transformer import TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "CELU", "ELU", "GELU", "GLU", "GRU", "LSTM", "RNN", "SELU", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AvgPool1d",
    "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Bilinear", "Conv1d", "Conv2d",
    "CrossEntropyLoss", "Dropout", "Dropout1d", "Dropout2d", "Embedding", "Flatten", "GRUCell", "GroupNorm",
    "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh", "HuberLoss", "Identity", "KLDivLoss", "L1Loss", "LSTMCell",
    "LayerNorm", "LeakyReLU", "Linear", "LogSigmoid", "LogSoftmax", "MSELoss", "MaxPool1d", "MaxPool2d", "Mish",
    "Module", "ModuleDict", "ModuleList", "MultiheadAttention", "NLLLoss", "PReLU", "Parameter", "ParameterDict",
    "ParameterList", "RMSNorm", "RNNBase", "RNNCell", "ReLU", "ReLU6", "Sequential", "SiLU", "Sigmoid", "SmoothL1Loss",
    "Softmax", "Softmin", "Softplus", "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold",
    "TransformerEncoder", "TransformerEncoderLayer", "Unflatten", "functional", "init",
]
