"""What to say when no rule found a problem, or when there was nothing to judge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity


def _open_question(f: Finding, th: Thresholds) -> bool:
    """An unsettled finding about a share of time a warning would be about: the run is
    not known to be healthy (saying so would contradict it)."""
    return f.evidence.get("settled") is False and (f.impact or 0.0) >= th.data_wait_warning_share


def overall(view: RunView, th: Thresholds, findings: Sequence[Finding]) -> list[Finding]:
    """``run.no_steps`` without steady steps; ``run.healthy`` when no finding is a
    warning or an error, nor an unsettled question about as much time (never both,
    never alongside a warning)."""
    s = view.summary
    if any(_open_question(f, th) for f in findings):
        return []
    if s.steps_steady < th.min_steady_steps:
        if any(f.severity is not Severity.INFO for f in findings):
            return []
        return [
            Finding(
                id="run.no_steps",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.INFO,
                title=(
                    f"Too few training steps to judge speed ({s.steps_steady} steady, "
                    f"{s.steps_total} in all)"
                ),
                evidence={
                    "steps_total": s.steps_total,
                    "steps_steady": s.steps_steady,
                    "steps_warmup": s.steps_warmup,
                    "min_steady_steps": th.min_steady_steps,
                },
                fix=(
                    "Run longer; if the script never calls optimizer.step() (custom loops, "
                    "other frameworks), mark its steps with trainmedic's step API."
                ),
            )
        ]
    if any(f.severity is not Severity.INFO for f in findings):
        return []
    busy = view.gpu_busy_share
    ev: dict[str, Any] = {
        "step_time_median_s": s.step_time_median_s,
        "steps_per_s": s.steps_per_s,
        "samples_per_s": s.samples_per_s,
        "data_wait_share": s.data_wait_share,
        "gpu_busy_share": busy,
        "job_cpu_cores": s.job_cpu_mean_cores,
        "usable_cores": view.usable_cores,
        "steady_steps": s.steps_steady,
    }
    wait = s.data_wait_share or 0.0
    cores, job = view.usable_cores, s.job_cpu_mean_cores
    # The time goes into the model; on a busy GPU, the GPU itself is the limit.
    category = Category.MODEL
    fix = "Nothing to fix; to go faster: a faster GPU, more GPUs (DDP), or a cheaper model."
    if busy is not None and busy * 100.0 >= th.gpu_util_high_pct:
        title = f"Training is compute-bound: GPU busy {busy:.0%}, data wait {wait:.0%}"
        category = Category.GPU_CAPACITY
    elif busy is None and view.uses_gpu is not True:
        fix = "Nothing to fix; to go faster, train on a GPU or on more cores."
        if cores and job is not None and job >= th.cpu_saturated_share * cores:
            title = (
                f"Training is compute-bound on the CPU: {job:.1f} of {cores:g} cores busy, "
                f"data wait {wait:.0%}"
            )
            category = Category.CPU
        else:
            title = f"No bottleneck found on the CPU-only run: data wait {wait:.0%} of step time"
    else:
        title = f"No bottleneck found: data wait {wait:.0%} of step time"
    return [
        Finding(
            id="run.healthy",
            category=category,
            severity=Severity.INFO,
            title=title,
            evidence={k: v for k, v in ev.items() if v is not None},
            fix=fix,
            impact=0.0,
        )
    ]
