"""Fix texts that more than one part of trainmedic gives for the same cause.

doctor, the run diagnosis and the failure classifier meet some causes from
different evidence; they must then recommend the same remedy in the same words.
"""

from __future__ import annotations

SHM_FIX = (
    "Give the container a larger /dev/shm: docker run --shm-size=16g (or --ipc=host); "
    "in Kubernetes mount an emptyDir with medium: Memory (and a sizeLimit) at /dev/shm."
)
"""A /dev/shm too small for DataLoader workers (Docker's default is 64 MiB)."""

SHM_FIX_WITH_WORKERS = SHM_FIX + " Or lower DataLoader num_workers / prefetch_factor."
"""The same, for a job whose workers already ran out of shared memory."""

# --- remedies the fixes point to (docs/remedies.md) -------------------------------------------

TUNE_LOADER_FIX = (
    "Measure the fastest loader settings for your data: trainmedic tune dataloader "
    "MODULE:FACTORY (MODULE.py:FACTORY returns your Dataset or DataLoader); or apply this "
    "run's recommendation unchanged: trainmedic run --apply-from RUN_DIR -- CMD."
)
"""Loader settings: the tuner, and ``--apply-from`` with this run's directory."""

LOCAL_CACHE_FIX = (
    "Read slow or remote data once: trainmedic.LocalCache(local_dir, max_bytes) keeps what "
    "the first epoch read on local disk (CachedFiles for file paths, CachedDataset for "
    "deterministic datasets)."
)
"""Data on a network filesystem or behind HTTP."""

THREADED_FETCH_FIX = (
    "Keep many samples in flight without more processes: "
    "trainmedic.ThreadedFetch(dataset, threads=16) fetches each batch with threads."
)
"""Latency-bound loading: threads, not cores."""

MICRO_BATCH_FIX = (
    "Let the step split itself when memory runs out: step = trainmedic.MicroBatchStep("
    "loss_fn, optimizer) redoes an out-of-memory batch as micro-batches with the same update "
    "(and reads TRAINMEDIC_MICRO_BATCH_DIVISOR after a restart); trainmedic tune batch-size "
    "MODULE:FACTORY finds the largest micro-batch that fits."
)
"""GPU memory short: automatic micro-batching and the batch-size finder."""

CUDA_OOM_FIX = (
    "Need less memory per step: a smaller micro-batch with gradient accumulation (same "
    "effective batch; after an out-of-memory restart trainmedic sets "
    "TRAINMEDIC_MICRO_BATCH_DIVISOR: read it with trainmedic.micro_batch_plan(batch_size)), "
    'bf16 autocast (torch.autocast("cuda", dtype=torch.bfloat16)), activation checkpointing '
    "(torch.utils.checkpoint); when memory reserved but unallocated is large (fragmentation) "
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. " + MICRO_BATCH_FIX
)
"""A GPU out of memory in torch: the run diagnosis's and the failure classifier's words."""

MIXED_PRECISION_CHECK_FIX = (
    "Measure it on your model first: trainmedic.check_mixed_precision(model, batch, loss_fn) "
    "compares bf16/fp16 autocast with float32 (speed, memory, loss); "
    "trainmedic run --apply-from RUN_DIR -- CMD turns on TF32 matmuls without code changes."
)
"""Full precision on tensor-core GPUs."""

RESILIENT_DATA_FIX = (
    "Keep a long run alive through bad samples: trainmedic.ResilientDataset(dataset) retries "
    "flaky reads with backoff and skips corrupt samples (logged, capped)."
)
"""Reads that fail now and then, or a corrupt file in a large data set."""


def loader_remedies(category: str) -> str:
    """The remedies for a loader whose time goes to ``category`` (a ``Category`` value)."""
    parts = [TUNE_LOADER_FIX]
    if category in ("io", "network"):
        parts.append(LOCAL_CACHE_FIX)
    if category == "network":
        parts.append(THREADED_FETCH_FIX)
    return " ".join(parts)
