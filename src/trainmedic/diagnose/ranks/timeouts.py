"""The collective timeout and watchdog settings that fit the run's observed step and phase times."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainmedic.diagnose.ranks.thresholds import (
    GLOO_DEFAULT_TIMEOUT_S,
    NCCL_DEFAULT_TIMEOUT_S,
    RankThresholds,
)
from trainmedic.diagnose.ranks.units import ms, nice
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.ranks import (
    RankStats,
)
from trainmedic.resilience.timeouts import TimeoutConfig


def collective_timeout(
    view: RunView, rt: RankThresholds, stats: Sequence[RankStats]
) -> list[Finding]:
    """The collective timeout and watchdog settings that fit this run's step and
    phase times (info)."""
    spans = list(view.split.steady) + list(view.split.warmup) + list(view.split.other_phases)
    if not spans:
        return []
    longest_step = max((s.duration_max_s for s in view.split.steady), default=0.0)
    warmup = max((s.duration_max_s for s in view.split.warmup), default=0.0)
    phases = [s for s in view.split.other_phases if s.step is not None]
    longest_phase = max(phases, key=lambda s: s.duration_s, default=None)
    phase_s = longest_phase.duration_s if longest_phase is not None else 0.0
    longest = max(longest_step, warmup, phase_s)
    recommended = max(rt.timeout_min_s, nice(rt.timeout_factor * longest))
    p99 = view.summary.step_time_p99_s or longest_step
    config = TimeoutConfig()
    bound = max(config.floor_s, config.safety_factor * p99)
    ev: dict[str, Any] = {
        "ranks": len(stats),
        "longest_step_s": longest_step,
        "longest_warmup_step_s": warmup,
        "longest_phase_s": phase_s,
        "longest_phase": longest_phase.phase if longest_phase is not None else None,
        "step_time_p99_s": p99,
        "recommended_collective_timeout_s": recommended,
        "nccl_default_timeout_s": NCCL_DEFAULT_TIMEOUT_S,
        "gloo_default_timeout_s": GLOO_DEFAULT_TIMEOUT_S,
        "trainmedic_hang_bound_s": bound,
    }
    seconds = int(recommended)
    return [
        Finding(
            id="distributed.collective_timeout",
            category=Category.TIMEOUT,
            severity=Severity.INFO,
            title=(
                f"Collective timeout to fit this run: {seconds} s (the longest gap between "
                f"collectives was {ms(longest)}; NCCL waits {NCCL_DEFAULT_TIMEOUT_S:.0f} s and "
                f"gloo {GLOO_DEFAULT_TIMEOUT_S:.0f} s by default)"
            ),
            evidence={k: v for k, v in ev.items() if v is not None},
            fix=_tf_fix(seconds, rt.timeout_factor, bound)
            if view.framework == "tensorflow"
            else (
                f"dist.init_process_group(backend, timeout=datetime.timedelta(seconds={seconds}))"
                f" — {rt.timeout_factor:g}× the longest step or phase seen, so a slow checkpoint "
                "or evaluation never times out, while a real hang ends the processes instead of "
                f"waiting the default; with NCCL also TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (a timed-"
                "out collective ends the process; never 0), TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="
                f"{seconds + 60} (above the collective timeout) and TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                "(the flight recorder's trace of the last collectives). trainmedic's watchdog "
                f"stops a hung group after about {bound:.0f} s here (--timeout-floor sets its "
                "minimum), with every rank's stacks, and restarts it."
            ),
            impact=None,
            subject="process_group",
        )
    ]


def _tf_fix(seconds: int, factor: float, bound: float) -> str:
    """The same settings for TensorFlow's collectives (MultiWorkerMirroredStrategy)."""
    return (
        "tf.distribute.MultiWorkerMirroredStrategy(communication_options="
        f"tf.distribute.experimental.CommunicationOptions(timeout_seconds={seconds})) — "
        f"{factor:g}× the longest step or phase seen, so a slow checkpoint or evaluation "
        "never times out, while a collective that waits for a lost worker fails instead "
        "of waiting for ever (TensorFlow's default). trainmedic's watchdog stops a hung "
        "group after about "
        f"{bound:.0f} s here (--timeout-floor sets its minimum), with every rank's "
        "stacks, and restarts it; BackupAndRestore resumes it."
    )
