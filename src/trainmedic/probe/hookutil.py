"""Small readers the torch hooks share: batch sizes, autocast, ``torch.compile`` tracing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_MAX_DEPTH = 4


def batch_size(value: Any, tensor_type: type, depth: int = 0) -> int | None:
    """First dimension of the first tensor found in ``value`` (tuples, lists, dicts)."""
    if depth == 0 and type(value) in (tuple, list) and value:
        first = value[0]  # the common case, ``(x, y)``, without a recursive call
        if isinstance(first, tensor_type):
            shape = first.shape  # type: ignore[attr-defined]
            return int(shape[0]) if len(shape) > 0 else None
    if isinstance(value, tensor_type):
        shape = value.shape  # type: ignore[attr-defined]
        return int(shape[0]) if len(shape) > 0 else None
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(value, (tuple, list)):
        for item in value[:8]:
            found = batch_size(item, tensor_type, depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, Mapping):
        for i, item in enumerate(value.values()):
            if i >= 8:
                break
            found = batch_size(item, tensor_type, depth + 1)
            if found is not None:
                return found
    return None


def autocast_reader(torch: Any) -> Callable[[], bool | None]:
    """A function telling whether autocast is on (CUDA or CPU), whichever API torch has."""
    is_enabled = getattr(torch, "is_autocast_enabled", None)
    if is_enabled is None:
        return lambda: None
    try:
        is_enabled("cuda")

        def by_device() -> bool | None:
            return bool(is_enabled("cuda") or is_enabled("cpu"))

        return by_device
    except TypeError:
        cpu = getattr(torch, "is_autocast_cpu_enabled", lambda: False)

        def legacy() -> bool | None:
            return bool(is_enabled() or cpu())

        return legacy


def compiling_reader(torch: Any) -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (torch 2.1+), else dynamo's own, else never."""
    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    if fn is None:
        dynamo = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
        fn = dynamo
    return fn if fn is not None else (lambda: False)
