"""Remedies: apply the fixes of the diagnosis, and measure that they worked.

Each remedy is reachable from here and, for the ones a training script calls,
from ``trainmedic`` itself. Nothing here imports torch until it is used: the
remedies run inside the user's training process, which has torch.

==========================  ==================================================
:func:`tune_dataloader`     faster DataLoader settings, measured (also
                            ``trainmedic tune dataloader``)
:class:`ThreadedFetch`      threads fetching each batch, for latency-bound data
:class:`MicroBatchStep`     a training step that splits its batch on OOM
:func:`find_batch_size`     the largest micro-batch that fits (also
                            ``trainmedic tune batch-size``)
:func:`check_mixed_precision`  bf16/fp16 autocast against float32, measured
:class:`ResilientDataset`   retries flaky reads, skips bad samples (capped)
:class:`LocalCache`         a bounded local cache for slow or remote data
                            (:class:`CachedFiles`, :class:`CachedDataset`)
==========================  ==================================================

``trainmedic run --apply-from RUN_DIR`` applies what a previous run's findings
recommend inside an unmodified script (:mod:`trainmedic.remedies.apply.plan`,
:mod:`trainmedic.probe.apply`). docs/remedies.md has the details.
"""

from __future__ import annotations

__all__ = [
    "BatchSizeResult",
    "CachedDataset",
    "CachedFiles",
    "LocalCache",
    "MicroBatchError",
    "MicroBatchStep",
    "MixedPrecision",
    "PrecisionReport",
    "ResilientDataset",
    "ThreadedFetch",
    "TooManyBadSamples",
    "TuneResult",
    "check_mixed_precision",
    "find_batch_size",
    "is_oom",
    "tune_dataloader",
]

_LAZY = {
    "BatchSizeResult": "trainmedic.remedies.batch_size",
    "find_batch_size": "trainmedic.remedies.batch_size",
    "CachedDataset": "trainmedic.remedies.cache",
    "CachedFiles": "trainmedic.remedies.cache",
    "LocalCache": "trainmedic.remedies.cache",
    "MicroBatchError": "trainmedic.remedies.microbatch",
    "MicroBatchStep": "trainmedic.remedies.microbatch",
    "is_oom": "trainmedic.remedies.oom",
    "MixedPrecision": "trainmedic.remedies.precision",
    "PrecisionReport": "trainmedic.remedies.precision",
    "check_mixed_precision": "trainmedic.remedies.precision",
    "ResilientDataset": "trainmedic.remedies.resilient",
    "TooManyBadSamples": "trainmedic.remedies.resilient",
    "ThreadedFetch": "trainmedic.remedies.threaded",
    "TuneResult": "trainmedic.remedies.loader_search",
    "tune_dataloader": "trainmedic.remedies.loader_tune",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainmedic.remedies' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
