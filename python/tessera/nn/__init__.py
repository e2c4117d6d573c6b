"""tessera.nn: PyTorch's torch.nn over Tessera (modules subclassed in Python, lazily traced)."""
from tessera.nn.module import Buffer, Module, Parameter  # noqa: F401  (first: the layers need them)
from tessera.nn import functional, init, utils  # noqa: F401
from tessera.nn.layers import (  # noqa: F401
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, GLU, Hardsigmoid, Hardswish, Hardtanh, LogSigmoid,
    MaxPool1d, Mish, PReLU, RMSNorm, Softsign, Upsample, BatchNorm1d, BCELoss, BCEWithLogitsLoss, HuberLoss, SmoothL1Loss, BatchNorm2d, Conv1d, Conv2d, ConvTranspose2d, CrossEntropyLoss,
    Dropout, Dropout2d, ELU, Embedding, Flatten, GELU, GroupNorm, Identity, L1Loss, LayerNorm, LeakyReLU, Linear,
    LogSoftmax, MaxPool2d, ModuleDict, ModuleList, MSELoss, NLLLoss, ParameterList, ReLU, ReLU6, Sequential, Sigmoid,
    SiLU, Softmax, Softplus, Tanh, Unflatten)
from tessera.nn.rnn import GRU, LSTM, RNN  # noqa: F401
from tessera.nn.transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer  # noqa: F401


def __getattr__(name):
    raise AttributeError(f"tessera.nn.{name} is not supported")
