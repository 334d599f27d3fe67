"""Out-of-memory errors, whichever allocator raised them, and freeing after one.

torch raises ``torch.cuda.OutOfMemoryError`` (a ``RuntimeError``) for CUDA and
a plain ``RuntimeError`` naming ``DefaultCPUAllocator`` for host memory (as
under an address-space limit); a ``MemoryError`` comes from Python itself.
The patterns are those of the failure classifier
(:mod:`trainmedic.resilience.classify`), so both call the same thing OOM.
"""

from __future__ import annotations

import gc
import re
import sys
from typing import Any

_OOM_TEXT = re.compile(
    r"CUDA out of memory|out of memory|DefaultCPUAllocator: can't allocate memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED|cuDNN error: CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)"
    r"|HIP out of memory|MPS backend out of memory",
    re.IGNORECASE,
)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of torch's allocators (or Python's)."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type: Any = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_TEXT.search(str(exc)))


def free_memory() -> None:
    """Release what a failed attempt held: Python garbage, then CUDA's cached blocks.

    The caller must have dropped its own references first (the exception's
    traceback keeps the failed frames' tensors alive until it is cleared).
    """
    gc.collect()
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        cuda.empty_cache()
