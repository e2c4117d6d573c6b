"""tessera.utils: torch.utils.data's datasets and loader (tessera.utils.data)."""
from tessera.utils import data  # noqa: F401


def __getattr__(name):
    raise AttributeError(f"tessera.utils.{name} is not supported")
