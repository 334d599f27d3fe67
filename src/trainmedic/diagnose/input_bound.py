"""Input-bound training: the loop waits for batches. One finding, named by the resource.

How much the loop waits is measured in :mod:`trainmedic.diagnose.data_wait`;
why, by the rule table of :mod:`trainmedic.diagnose.input_causes`. Here the
two become the finding, with the loader settings ``run --apply-from`` may set.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.data_wait import (
    data_share_sample,
    data_wait,
    exposed_wait_share,
    is_input_bound,
    recommended_workers,
)
from trainmedic.diagnose.input_causes import InputCause, input_cause
from trainmedic.diagnose.sampled import interval_evidence
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
    settled, error = cause.settled, exposed >= th.data_wait_error_share
    sample = data_share_sample(view, th)  # a loop without a DataLoader: sampled
    scale = wait.ordinary_s / wait.steady_s if wait.steady_s > 0 else 0.0
    if sample is not None:
        # The wait is data only in the sampled share: decided on its interval.
        settled = settled and sample.versus(th.data_wait_warning_share, scale) is True
        error = error and sample.versus(th.data_wait_error_share, scale) is True
    severity = Severity.ERROR if error else Severity.WARNING
    if not settled:
        severity = Severity.INFO
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
    if sample is not None:
        evidence["outside_step_data_share"] = round(sample.share, 4)
        evidence["outside_step_data_share_interval"] = interval_evidence(sample)
        evidence["data_wait_share_interval"] = interval_evidence(sample, scale)
        evidence["outside_stack_samples"] = int(sample.samples)
    if view.gpu_util_pct is not None:
        evidence["gpu_utilization_pct"] = view.gpu_util_pct
    evidence.update(cause.evidence)
    title = f"Training waits for data {exposed:.0%} of step time: {cause.title}"
    remedies = cause.remedies
    if remedies is None:
        remedies = loader_remedies(cause.category.value)
    fix = cause.fix
    if not settled and cause.settled and sample is not None:
        low, high = sample.low * scale, sample.high * scale
        evidence["settled"] = False
        title = (
            f"Training may wait for data {exposed:.0%} of step time ({low:.0%}-{high:.0%} "
            f"from {int(sample.samples)} stack samples): {cause.title}"
        )
        fix = (
            f"Not settled: the stack samples between steps put the data share of the step "
            f"between {low:.0%} and {high:.0%}, across the {th.data_wait_warning_share:.0%} "
            "bar; a longer run settles it. If it is data: " + fix
        )
    return [
        Finding(
            id=f"input.{cause.key}",
            category=cause.category,
            severity=severity,
            title=title,
            evidence=evidence,
            fix=f"{fix} {remedies}".strip(),
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
    if any(lo.dataset_type == "tf.data" for lo in view.train_loaders):
        return None  # a tf.data pipeline's settings are in the script: the fix says which
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
