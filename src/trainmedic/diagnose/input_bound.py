"""Input-bound training: the loop waits for batches. One finding, named by the resource.

How much the loop waits is measured in :mod:`trainmedic.diagnose.data_wait`;
why, by the rule table of :mod:`trainmedic.diagnose.input_causes`. Here the
two become the finding, with the loader settings ``run --apply-from`` may set.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.data_wait import (
    data_wait,
    exposed_wait_share,
    is_input_bound,
    recommended_workers,
)
from trainmedic.diagnose.input_causes import InputCause, input_cause
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.fixes import loader_remedies
from trainmedic.findings.model import Category, Finding, Severity


def input_bound(view: RunView, th: Thresholds) -> list[Finding]:
    """Data wait high: a warning from ``data_wait_warning_share``, an error from
    ``data_wait_error_share``."""
    if not is_input_bound(view, th):
        return []
    exposed = exposed_wait_share(view, th)
    assert exposed is not None
    s = view.summary
    wait = data_wait(view, th)
    cause = input_cause(view, th)
    severity = Severity.ERROR if exposed >= th.data_wait_error_share else Severity.WARNING
    evidence: dict[str, Any] = {
        "data_wait_share": s.data_wait_share,
        "data_wait_exposed_share": exposed,
        "data_wait_warning_share": th.data_wait_warning_share,
        "data_wait_error_share": th.data_wait_error_share,
        "step_time_median_s": s.step_time_median_s,
        "steady_steps": s.steps_steady,
    }
    if wait.stall_s > 0:
        evidence["stall_wait_excluded_s"] = wait.stall_s
    if not view.train_loaders and wait.data_share is not None:
        evidence["outside_step_data_share"] = wait.data_share
    if view.gpu_util_pct is not None:
        evidence["gpu_utilization_pct"] = view.gpu_util_pct
    evidence.update(cause.evidence)
    return [
        Finding(
            id=f"input.{cause.key}",
            category=cause.category,
            severity=severity,
            title=f"Training waits for data {exposed:.0%} of step time: {cause.title}",
            evidence=evidence,
            fix=f"{cause.fix} {loader_remedies(cause.category.value)}",
            impact=exposed,
            subject="dataloader",
            apply=loader_apply(view, th, cause),
        )
    ]


def loader_apply(view: RunView, th: Thresholds, cause: InputCause) -> dict[str, Any] | None:
    """The loader settings of the fix that ``run --apply-from`` may set: more worker
    processes where the cause is not a CPU already full (``cpu``, ``contention``),
    and fetch threads inside them where the loading waits on latency.

    The counts are the ones the fix recommends (sized from the measured fetch
    time when it could be). Threads are applied by wrapping the script's
    map-style dataset so that a batch's samples are fetched concurrently
    (:class:`~trainmedic.remedies.threaded.ThreadedFetch`)."""
    workers = view.num_workers
    wanted = cause.evidence.get("recommended_num_workers")
    n = int(wanted) if isinstance(wanted, (int, float)) else recommended_workers(view, th)
    if cause.category in (Category.CPU, Category.CONTENTION) or workers is None:
        return None
    threads = cause.evidence.get("recommended_threads_per_worker")
    threads = int(threads) if isinstance(threads, (int, float)) and threads > 1 else 1
    if workers >= n and threads == 1:
        return None
    settings: dict[str, Any] = {"num_workers": max(n, workers), "prefetch_factor": 4}
    if threads > 1:
        settings["threads"] = threads
    if view.uses_gpu:
        settings["pin_memory"] = True
    return {"dataloader": settings}
