"""tessera.optim: PyTorch's optimizers as Python classes over Tessera's multi-tensor update kernels."""
from tessera.optim.optimizer import Optimizer  # noqa: F401
from tessera.optim.optimizers import SGD, Adam, AdamW  # noqa: F401
from tessera.optim.python_rules import Adadelta, Adagrad, RMSprop  # noqa: F401
from tessera.optim import lr_scheduler  # noqa: F401


def __getattr__(name):
    raise AttributeError(f"tessera.optim.{name} is not supported")
