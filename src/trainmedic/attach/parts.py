"""Where the training thread's samples fall: the parts of a training step.

The training thread of each training process is the thread whose samples
fall most in training code (DataLoader, forward, backward, optimizer); each
of its samples is put in one part by the frames it holds (:func:`part_of`):

* ``data_in_process``: inside the DataLoader's fetch in this thread - the
  Dataset and collate run here (``num_workers=0``);
* ``data_wait``: inside the DataLoader, waiting for its workers;
* ``collective`` (``torch.distributed``), ``backward`` (autograd),
  ``optimizer`` (``torch.optim``), ``forward`` (module calls and other torch
  operations), ``checkpoint`` (``torch.save``/``load``);
* ``host``: anything else (the loop's own Python, logging, a sleep, batches
  made by hand), which :mod:`~trainmedic.attach.loading` names further.

Shares come with their Wilson interval (``share_z`` of the thresholds): with
50 samples a second a 30 s window knows a share to about +-2.5 points.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from trainmedic.attach.observe import Observation
from trainmedic.attach.spy import Stack, ThreadSamples
from trainmedic.attach.tree import JobProcess
from trainmedic.diagnose.sampled import wilson_interval
from trainmedic.diagnose.thresholds import DEFAULT_THRESHOLDS, Thresholds

PARTS = (
    "data_in_process",
    "data_wait",
    "collective",
    "backward",
    "optimizer",
    "forward",
    "checkpoint",
    "host",
)
TRAINING_PARTS = frozenset(PARTS) - {"host", "checkpoint"}
"""The parts that train; a checkpoint is time the step waits for (``host.file_write``)."""
MIN_SAMPLES = 20
"""Samples of a training thread below which nothing is said of its time."""
_DATA = "torch/utils/data/"
_FETCH = "torch/utils/data/_utils/fetch.py"
_TORCH = "/torch/"
_TENSOR_TEXT = "torch/_tensor_str.py"
_TEXT_FUNCTIONS = frozenset({"__repr__", "__str__", "__format__"})
"""A tensor turned into text is logging, whatever torch does inside."""
_BY_FILE = (
    ("torch/distributed/", "collective"),
    ("torch/autograd/", "backward"),
    ("torch/optim/", "optimizer"),
    ("torch/nn/modules/module.py", "forward"),
    ("torch/serialization.py", "checkpoint"),
)


def part_of(stack: Stack) -> str:
    """The part of a training step a stack (innermost first) is in (module docstring)."""
    files = [f.file.replace("\\", "/") for f in stack]
    if any(_DATA in f for f in files):
        return "data_in_process" if any(_FETCH in f for f in files) else "data_wait"
    for marker, part in _BY_FILE:
        if any(marker in f for f in files):
            return part
    if any(
        f.endswith("torch/_tensor.py") and fr.function == "backward"
        for f, fr in zip(files, stack, strict=True)
    ):
        return "backward"
    if any(_TORCH in f and not f.endswith(_TENSOR_TEXT) for f in files) and not any(
        f.endswith("torch/_tensor.py") and fr.function in _TEXT_FUNCTIONS
        for f, fr in zip(files, stack, strict=True)
    ):
        # A loss or functional op written outside any module: training compute. (Making
        # tensors from host data, ``torch.randn``/``stack``, is C with no frame of its own.)
        return "forward"
    return "host"


@dataclass(frozen=True)
class TrainingThread:
    """The training thread of one training process and where its samples fell."""

    process: JobProcess
    thread: ThreadSamples
    parts: dict[str, int]

    @property
    def samples(self) -> int:
        return self.thread.total


def training_threads(obs: Observation) -> list[TrainingThread]:
    """Each training process's training thread (module docstring)."""
    out: list[TrainingThread] = []
    for p in obs.tree.by_role("training"):
        threads = [t for (pid, _), t in obs.sampling.threads.items() if pid == p.pid]
        if not threads:
            continue
        scored = []
        for t in threads:
            parts: Counter[str] = Counter()
            for stack, n in t.stacks.items():
                parts[part_of(stack)] += n
            training = sum(n for k, n in parts.items() if k in TRAINING_PARTS)
            scored.append((training, t.tid == p.pid, t, parts))
        _, _, thread, parts = max(scored, key=lambda s: (s[0], s[1]))
        out.append(TrainingThread(p, thread, {k: parts.get(k, 0) for k in PARTS}))
    return out


def _share(hits: int, n: int, th: Thresholds) -> dict[str, float]:
    low, high = wilson_interval(hits, n, th.share_z)
    return {"share": round(hits / n, 4) if n else 0.0, "low": round(low, 4), "high": round(high, 4)}


def time_split(t: TrainingThread, th: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The training thread's parts as shares with their intervals."""
    return {k: _share(n, t.samples, th) for k, n in t.parts.items() if n}
