"""trainmedic: why is deep-learning training slow or stuck, with no code change.

The public API is what a training script may call, and the errors it may
catch; everything else is reached through the ``trainmedic`` command (a run
directory's findings from Python: :func:`trainmedic.diagnose.diagnose`). The
API is loaded on first use, so ``import trainmedic`` stays cheap (and never
imports torch).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "CachedDataset",
    "CheckpointError",
    "Checkpointer",
    "InputError",
    "LocalCache",
    "MicroBatchError",
    "MicroBatchStep",
    "ResilientDataset",
    "RunDirectoryError",
    "SimulationFileError",
    "ThreadedFetch",
    "TooManyBadSamples",
    "TrainmedicError",
    "UsageError",
    "__version__",
    "check_mixed_precision",
    "find_batch_size",
    "max_num_workers",
    "micro_batch_divisor",
    "micro_batch_plan",
    "phase",
    "remedy",
    "step",
    "tune_dataloader",
]

_LAZY = {
    # The exception tree (trainmedic.errors), and the remedies' own errors.
    "TrainmedicError": "trainmedic.errors",
    "UsageError": "trainmedic.errors",
    "InputError": "trainmedic.errors",
    "RunDirectoryError": "trainmedic.errors",
    "SimulationFileError": "trainmedic.errors",
    "CheckpointError": "trainmedic.errors",
    "MicroBatchError": "trainmedic.remedies.microbatch",
    "TooManyBadSamples": "trainmedic.remedies.resilient",
    "step": "trainmedic.api",
    "phase": "trainmedic.api",
    "Checkpointer": "trainmedic.checkpoint",
    "micro_batch_divisor": "trainmedic.remedy_api",
    "micro_batch_plan": "trainmedic.remedy_api",
    "max_num_workers": "trainmedic.remedy_api",
    "remedy": "trainmedic.remedy_api",
    # Remedies a training script calls (trainmedic.remedies has them all).
    "MicroBatchStep": "trainmedic.remedies.microbatch",
    "find_batch_size": "trainmedic.remedies.batch_size",
    "check_mixed_precision": "trainmedic.remedies.precision",
    "ResilientDataset": "trainmedic.remedies.resilient",
    "LocalCache": "trainmedic.remedies.cache",
    "CachedDataset": "trainmedic.remedies.cache",
    "ThreadedFetch": "trainmedic.remedies.threaded",
    "tune_dataloader": "trainmedic.remedies.loader_tune",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainmedic' has no attribute {name!r}")
