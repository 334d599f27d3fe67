"""Small readers the torch hooks share: batch sizes, autocast, ``torch.compile`` tracing."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

_MAX_DEPTH = 4
_SEQUENCES = (tuple, list)


def batch_size(value: Any, tensor_type: type, depth: int = 0) -> int | None:
    """First dimension of the first tensor found in ``value`` (tuples, lists, dicts)."""
    if type(value) in _SEQUENCES and value and depth == 0:
        first = value[0]  # the common case, ``(x, y)``, without a recursive call
        if isinstance(first, tensor_type):
            shape = first.shape  # type: ignore[attr-defined]
            return int(shape[0]) if shape else None
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


def autocast_readers(torch: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """Two C-level callables telling whether autocast is on for CUDA and for the CPU.

    ``functools.partial`` of torch's own functions, so that a hook calling them
    runs no Python frame; without any autocast API both always answer ``None``.
    """
    is_enabled = getattr(torch, "is_autocast_enabled", None)
    if is_enabled is None:
        return (_none, _none)
    try:
        is_enabled("cuda")
        return (functools.partial(is_enabled, "cuda"), functools.partial(is_enabled, "cpu"))
    except TypeError:  # torch before 2.4: no device argument
        return (is_enabled, getattr(torch, "is_autocast_cpu_enabled", _none))


def _none() -> None:
    return None


def compiling_reader(torch: Any) -> Callable[[], bool]:
    """Whether ``torch.compile`` is tracing: ``torch.compiler.is_compiling`` (torch 2.1+),
    else dynamo's own, looked up when asked (dynamo loads on first use), else never.

    Call it only when ``"torch._dynamo" in sys.modules``: it cannot be tracing before."""
    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    if fn is not None:
        return fn  # type: ignore[no-any-return]

    def by_dynamo() -> bool:
        dynamo = sys.modules.get("torch._dynamo")
        check = getattr(dynamo, "is_compiling", None)
        return bool(check()) if check is not None else False

    return by_dynamo


def dynamo_reader(torch: Any) -> Callable[[], bool]:
    """Whether dynamo is tracing, for the hooks dynamo alone may trace (the optimizer's):
    ``torch.compiler.is_dynamo_compiling`` (torch 2.3+), else :func:`compiling_reader`'s.

    Outside tracing it is one Python frame that returns ``False``, where
    ``is_compiling()`` is two (it asks ``torch.jit.is_scripting()`` first); dynamo
    folds either to ``True`` while it traces. What it leaves out is
    ``torch.export``'s non-strict tracing, which runs a model's forward, never an
    optimizer step. Call it only when ``"torch._dynamo" in sys.modules``."""
    fn = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", None)
    if fn is not None:
        return fn  # type: ignore[no-any-return]
    return compiling_reader(torch)


def run_while_tracing(fn: _F) -> _F:
    """Mark ``fn`` so that ``torch.compile`` calls it while tracing and leaves it out of the graph.

    A hook that steps aside under tracing (``is_compiling()``) is gone from the
    compiled code: when that code runs, the hook does not. Called from the hook's
    compiling branch, a function marked here tells the probe, each time dynamo traces
    the hook, what was compiled away. Dynamo calls a function carrying the mark that
    ``torch._dynamo.assume_constant_result`` sets (set here directly: importing
    dynamo would cost the job start-up time) for real while it traces, and folds
    its result into the graph as a constant: nothing of it runs when the compiled
    code runs, and nothing in it (the thread test, the clock) can break the
    graph. Its arguments must be constants or plain objects; it returns ``None``.
    Outside tracing it is an ordinary function.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn
