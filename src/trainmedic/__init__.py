"""trainmedic: why is deep-learning training slow or stuck, with no code change.

The public API is what a training script may call; everything else is reached
through the ``trainmedic`` command. ``step`` and ``phase`` are loaded on first
use, so ``import trainmedic`` stays cheap (and never imports torch).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "phase", "step"]


def __getattr__(name: str) -> Any:
    if name in ("step", "phase"):
        from trainmedic import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainmedic' has no attribute {name!r}")
