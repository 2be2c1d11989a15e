"""cronoq: a task scheduler with remote workers.

``import cronoq`` stays cheap: the gRPC SDK (``cronoq.client``, which pulls in grpc) loads on first
attribute access, so a handler module can raise ``cronoq.Retryable`` without paying for it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from cronoq.errors import CronoqError, Permanent, Retryable

__version__ = "0.1.0"

# ``client`` is left out so that ``from cronoq import *`` does not import grpc.
__all__ = ["CronoqError", "Permanent", "Retryable", "__version__"]

_LAZY_SUBMODULES = frozenset({"client"})


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"cronoq.{name}")
    raise AttributeError(f"module 'cronoq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES)
