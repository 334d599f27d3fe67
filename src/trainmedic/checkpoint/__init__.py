"""Checkpoints that survive crashes: atomic, verified, pruned, safe to load.

A training script saves and resumes with a :class:`Checkpointer`::

    ckpt = trainmedic.Checkpointer("ckpt/", keep=3, every_seconds=600)
    start = ckpt.load(model=model, optimizer=opt, scheduler=sched, scaler=scaler) or 0
    for step in range(start + 1, total + 1):
        ...
        ckpt.maybe_save(step, model=model, optimizer=opt, scheduler=sched, scaler=scaler)

The contract (docs/restarts.md, "Checkpointer"):

- **Atomic.** Each checkpoint is a data file written to a temporary file in
  the same directory, flushed, ``fsync``-ed and renamed into place, then a
  small JSON manifest (the commit record) written the same way; the directory
  is ``fsync``-ed after each rename. A crash at any moment leaves either the
  whole checkpoint or none of it.
- **Verified.** The manifest holds the SHA-256 and size of the data file;
  :meth:`Checkpointer.load` checks both and falls back to the previous
  checkpoint, with a :class:`CheckpointWarning`, when the newest is corrupt
  or truncated. When checkpoints exist but none can be loaded it raises
  :class:`~trainmedic.errors.CheckpointError` naming every file: it never
  silently starts from scratch.
- **Safe to load.** Data files are read with ``torch.load(weights_only=True)``;
  RNG states are stored as tensors, lists and numbers so that the restricted
  unpickler accepts them, and a file holding any other object is refused.
- **Bounded.** The newest ``keep`` checkpoints (in save order) are kept.
- **Private.** A directory it creates gets mode 0700; every file 0600.

Only this package (and the probe) import torch, and only when a checkpoint is
saved or loaded; ``import trainmedic`` stays cheap. The saving, loading and
pruning are in :mod:`trainmedic.checkpoint.checkpointer`, the files and their
verification in :mod:`trainmedic.checkpoint.files`, what a checkpoint holds
(states, RNG) in :mod:`trainmedic.checkpoint.state`.
"""

from __future__ import annotations

from trainmedic.checkpoint.checkpointer import (
    CHECKPOINT_DIR_ENV,
    Checkpointer,
    CheckpointWarning,
    LoadedCheckpoint,
)
from trainmedic.checkpoint.files import FORMAT, FORMAT_VERSION, MAX_MANIFEST_BYTES, CheckpointInfo
from trainmedic.checkpoint.state import SupportsStateDict

__all__ = [
    "CHECKPOINT_DIR_ENV",
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_MANIFEST_BYTES",
    "CheckpointInfo",
    "CheckpointWarning",
    "Checkpointer",
    "LoadedCheckpoint",
    "SupportsStateDict",
]
