"""Out-of-memory errors, whichever allocator raised them, and freeing after one.

torch raises ``torch.cuda.OutOfMemoryError`` (a ``RuntimeError``) for CUDA and
a plain ``RuntimeError`` naming ``DefaultCPUAllocator`` for host memory (as
under an address-space limit); a ``MemoryError`` comes from Python itself.
The patterns are the failure classifier's (GPU: :mod:`trainmedic.gpu.faults`,
host: :mod:`trainmedic.resilience.classify.patterns`), so both call the same
thing OOM.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from trainmedic.gpu import faults


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of torch's allocators (or Python's)."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type: Any = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    # Imported here: the classifier's package is the supervisor's, loaded in the job
    # only when an error has to be judged.
    from trainmedic.resilience.classify import patterns

    text = str(exc)
    return faults.is_cuda_oom(text) or patterns.HOST_ALLOC_RE.search(text) is not None


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
