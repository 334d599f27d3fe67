"""The wait for data: how much of the steady steps the loop spends waiting
for batches, and whether that makes the run input-bound.

Only the ordinary wait counts: the wait inside stalls is the stall rule's
(:mod:`trainmedic.diagnose.stalls`), so no time is counted twice. In a loop
without a DataLoader, the time outside forward/backward/optimizer is data
preparation only in the share its stack samples show data code
(:mod:`trainmedic.diagnose.host_time` names the rest), and tensor work
cheaper per step than a worker's hand-off of a batch is the loop's own.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from trainmedic.diagnose.sampled import SampledShare, sampled
from trainmedic.diagnose.stalls import find_stalls
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.record.sample_states import DATA_STATES


@dataclass(frozen=True)
class DataWait:
    """The wait for data over the steady part, seconds and shares of steady time.

    Attributes:
        recorded_s: the probe's data wait (DataLoader ``__next__``; without a
            DataLoader, host time outside forward/backward/optimizer).
        stall_s: of it, inside stalls (the stall rule counts that).
        data_share: share of the rest that is data preparation (1 with a
            DataLoader; the stack samples' data share without one; ``None``
            when they are too few to tell).
    """

    recorded_s: float
    stall_s: float
    data_share: float | None
    steady_s: float

    @property
    def ordinary_s(self) -> float:
        return max(0.0, self.recorded_s - self.stall_s)

    @property
    def share(self) -> float:
        """Ordinary data wait over steady time (the data part only)."""
        if self.steady_s <= 0:
            return 0.0
        return self.ordinary_s * (self.data_share or 0.0) / self.steady_s


def _measure_data_wait(view: RunView, th: Thresholds) -> DataWait:
    steady = view.steady_time_s
    recorded = sum(s.data_wait_s for s in view.steady)
    median = view.summary.step_time_median_s or 0.0
    stall_s = 0.0
    for st in find_stalls(view, th):
        span = st.span
        if span.step is not None:
            stall_s += span.data_wait_s
        else:  # a folded window: only the stall's excess can be told apart
            stall_s += min(span.data_wait_s, max(0.0, st.duration_s - median))
    return DataWait(recorded, min(stall_s, recorded), data_share(view, th), steady)


def data_wait(view: RunView, th: Thresholds) -> DataWait:
    """The run's :class:`DataWait` (computed once per view and thresholds)."""
    return view.memo(("data_wait", th), lambda: _measure_data_wait(view, th))


def data_share(view: RunView, th: Thresholds) -> float | None:
    """Share of the recorded wait that is data preparation (see :class:`DataWait`)."""
    if view.train_loaders:
        return 1.0
    sample = data_share_sample(view, th)
    return None if sample is None else sample.share


def data_share_sample(view: RunView, th: Thresholds) -> SampledShare | None:
    """The data share of a loop without a DataLoader as sampled (``None`` with fewer than
    ``outside_min_samples`` samples, or with a DataLoader)."""
    if view.train_loaders:
        return None
    outside = view.outside_activity()
    total = sum(outside.values())
    if total < th.outside_min_samples:
        return None
    data = sum(outside.get(s, 0) for s in DATA_STATES)
    if batch_building_is_tiny(view, th, outside):
        data -= outside.get("transform", 0)
    return sampled(data, total, th)


def batch_building_is_tiny(view: RunView, th: Thresholds, outside: Counter[str]) -> bool:
    """In a loop without a DataLoader: building a batch in the loop costs less per step
    than handing one over from a worker process would (``worker_handoff_s``). Then it is
    the loop's own tensor work (``host.python``), not a wait a DataLoader could hide."""
    total = sum(outside.values())
    steps = view.summary.steps_steady
    if total <= 0 or steps <= 0 or not outside.get("transform"):
        return False
    per_step = sum(s.data_wait_s for s in view.steady) / steps
    return per_step * outside["transform"] / total < th.worker_handoff_s


def exposed_wait_share(view: RunView, th: Thresholds) -> float | None:
    """Share of steady step time the wait for data costs.

    The wait is all lost time unless the job's GPUs stay busy meanwhile (work
    queued before the wait): when they are busy at least ``gpu_util_high_pct``,
    only their idle share can be lost to waiting.
    """
    if view.summary.data_wait_share is None:
        return None
    wait = data_wait(view, th).share
    util = view.gpu_util_pct
    if util is not None and util >= th.gpu_util_high_pct:
        return min(wait, max(0.0, 1.0 - util / 100.0))
    return wait


def is_input_bound(view: RunView, th: Thresholds) -> bool:
    exposed = exposed_wait_share(view, th)
    return (
        view.summary.steps_steady >= th.min_steady_steps
        and exposed is not None
        and exposed >= th.data_wait_warning_share
    )


def recommended_workers(view: RunView, th: Thresholds) -> int:
    """Worker processes the cores justify per training process: the usable cores shared
    by the processes, one core kept for each main process, at least 2 and at most
    ``max_recommended_workers``."""
    cores = view.usable_cores or 4.0
    per_process = math.floor(cores / view.concurrent_processes) - 1
    return max(2, min(th.max_recommended_workers, per_process))
