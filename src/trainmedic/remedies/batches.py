"""Batches as nested structures of tensors: their size, and splitting them along dim 0.

A batch is whatever a DataLoader yields: a tensor, or tuples, lists and dicts
of tensors and other values. Its size is the first dimension of its first
tensor; splitting cuts every tensor with that first dimension and passes
everything else (scalars, strings, tensors of another length) whole to each
part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MAX_DEPTH = 8


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "narrow") and hasattr(value, "dim")


def batch_size(batch: Any, _depth: int = 0) -> int | None:
    """First dimension of the first tensor in ``batch``, ``None`` when there is none."""
    if _is_tensor(batch):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if _depth >= _MAX_DEPTH:
        return None
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, (tuple, list, Mapping)):
        for item in items:
            found = batch_size(item, _depth + 1)
            if found is not None:
                return found
    return None


def narrow(batch: Any, start: int, length: int, size: int) -> Any:
    """Rows ``start:start+length`` of every tensor whose first dimension is ``size``."""
    if _is_tensor(batch):
        if batch.dim() > 0 and int(batch.shape[0]) == size:
            return batch.narrow(0, start, length)
        return batch
    if isinstance(batch, Mapping):
        return type(batch)(  # type: ignore[call-arg]
            {k: narrow(v, start, length, size) for k, v in batch.items()}
        )
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(narrow(v, start, length, size) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(narrow(v, start, length, size) for v in batch)
    return batch


def split(batch: Any, micro: int) -> list[tuple[Any, int]]:
    """``batch`` cut into parts of ``micro`` rows (the last may be smaller), with their sizes."""
    size = batch_size(batch)
    if size is None or micro >= size:
        return [(batch, size or 0)]
    return [
        (narrow(batch, start, min(micro, size - start), size), min(micro, size - start))
        for start in range(0, size, micro)
    ]
