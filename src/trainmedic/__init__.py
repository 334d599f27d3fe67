"""trainmedic: why is deep-learning training slow or stuck, with no code change.

The public API is what a training script may call; everything else is reached
through the ``trainmedic`` command. The API is loaded on first use, so
``import trainmedic`` stays cheap (and never imports torch).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "Checkpointer",
    "__version__",
    "max_num_workers",
    "micro_batch_divisor",
    "micro_batch_plan",
    "phase",
    "remedy",
    "step",
]

_LAZY = {
    "step": "trainmedic.api",
    "phase": "trainmedic.api",
    "Checkpointer": "trainmedic.checkpoint",
    "micro_batch_divisor": "trainmedic.remedy_api",
    "micro_batch_plan": "trainmedic.remedy_api",
    "max_num_workers": "trainmedic.remedy_api",
    "remedy": "trainmedic.remedy_api",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainmedic' has no attribute {name!r}")
