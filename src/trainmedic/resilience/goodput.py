"""Goodput: where a run's wall time went across its attempts. Pure arithmetic.

Each attempt's timeline is cut at the moments the supervisor recorded
(Unix seconds): it started; its first step began; its last step ended; a
hang began (the last sign of life) and was detected; its processes were
gone. The pieces add up to the run's wall time:

* ``startup`` — from an attempt's start to its first step (imports, data
  set up, compilation, loading a checkpoint);
* ``productive`` — step time that moved the run past the furthest step any
  earlier attempt reached;
* ``redone`` — step time that repeated steps an earlier attempt had done
  (what was lost since the last checkpoint); known only when the attempt's
  resume step is known (a Checkpointer reported it, or the checkpoint's name
  told it), else counted as productive and flagged;
* ``lost`` — from the last step to a crash: the step that failed;
* ``detect`` — from the start of a hang to its detection;
* ``restart`` — from detection or exit to the next attempt's start:
  forensics, stopping the job, waiting for GPU memory, classifying;
* ``backoff`` — the policy's deliberate wait before a restart;
* ``other`` — the rest: trainmedic's own start, a finished job's shutdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AttemptTimes:
    """One attempt's timeline (Unix seconds) and steps.

    Attributes:
        started_at / ended_at: the job started; its last process was gone.
        first_step_start / last_step_end: the first and last training steps
            (``None`` without steps).
        hang_started_at / detected_at: a hang's last sign of life and its detection.
        steps: training steps the attempt completed.
        resume_step: the step it resumed from (``None``: unknown, or a fresh
            start for the first attempt).
        wait_s: backoff before the next attempt.
        succeeded: the attempt ended the run successfully.
    """

    started_at: float
    ended_at: float
    first_step_start: float | None = None
    last_step_end: float | None = None
    hang_started_at: float | None = None
    detected_at: float | None = None
    steps: int = 0
    resume_step: int | None = None
    wait_s: float = 0.0
    succeeded: bool = False


@dataclass(frozen=True)
class Goodput:
    """The run's wall time split by use; seconds.

    Attributes:
        redone_known: ``False`` when some attempt's resume step was unknown
            (its steps count as productive).
        steps_redone: steps repeated across attempts, when known.
    """

    wall_s: float
    productive_s: float
    startup_s: float
    redone_s: float
    lost_s: float
    detect_s: float
    restart_s: float
    backoff_s: float
    other_s: float
    redone_known: bool = True
    steps_redone: int = 0

    @property
    def share(self) -> float:
        """Productive share of the wall time (0..1)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_evidence(self) -> dict[str, float | int | bool]:
        """The split for a finding's evidence (seconds, and the productive share)."""
        return {
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "startup_s": round(self.startup_s, 3),
            "redone_s": round(self.redone_s, 3),
            "lost_s": round(self.lost_s, 3),
            "detect_s": round(self.detect_s, 3),
            "restart_s": round(self.restart_s, 3),
            "backoff_s": round(self.backoff_s, 3),
            "other_s": round(self.other_s, 3),
            "goodput_share": round(self.share, 4),
            "steps_redone": self.steps_redone,
            "redone_known": self.redone_known,
        }


def compute_goodput(
    attempts: Sequence[AttemptTimes], run_started_at: float, run_ended_at: float
) -> Goodput:
    """Split ``run_started_at``..``run_ended_at`` over the attempts' timelines."""
    parts = dict.fromkeys(
        ("productive", "startup", "redone", "lost", "detect", "restart", "backoff"), 0.0
    )
    best = 0
    redone_known = True
    steps_redone = 0
    for i, a in enumerate(attempts):
        start, end = a.started_at, max(a.started_at, a.ended_at)
        work_start = _within(a.first_step_start, start, end)
        work_end = _within(a.last_step_end, start, end)
        if work_start is not None and work_end is not None and work_end >= work_start:
            parts["startup"] += work_start - start
            work = work_end - work_start
            resume = a.resume_step if a.resume_step is not None else (0 if i == 0 else None)
            if resume is None:
                redone_known = False
                redone_steps = 0
                best = max(best, a.steps)
            else:
                redone_steps = min(a.steps, max(0, best - resume))
                best = max(best, resume + a.steps)
            redone = work * redone_steps / a.steps if a.steps > 0 else 0.0
            steps_redone += redone_steps
            parts["redone"] += redone
            parts["productive"] += work - redone
            tail_start = work_end
        else:
            tail_start = start  # no step at all: everything before the end is start-up
        hang = _within(a.hang_started_at, tail_start, end)
        detected = _within(a.detected_at, tail_start, end)
        if detected is not None:
            begin = hang if hang is not None else tail_start
            if work_start is None:
                parts["startup"] += begin - tail_start
            else:
                parts["lost"] += begin - tail_start
            parts["detect"] += detected - begin
            parts["restart"] += end - detected
        elif a.succeeded or i == len(attempts) - 1:
            if work_start is None:
                parts["startup"] += end - tail_start
            # a finished job's shutdown is "other"
        elif work_start is None:
            parts["startup"] += end - tail_start
        else:
            parts["lost"] += end - tail_start
        if i + 1 < len(attempts):
            gap = max(0.0, attempts[i + 1].started_at - end)
            wait = min(gap, max(0.0, a.wait_s))
            parts["backoff"] += wait
            parts["restart"] += gap - wait
    wall = max(0.0, run_ended_at - run_started_at)
    used = sum(parts.values())
    return Goodput(
        wall_s=wall,
        productive_s=parts["productive"],
        startup_s=parts["startup"],
        redone_s=parts["redone"],
        lost_s=parts["lost"],
        detect_s=parts["detect"],
        restart_s=parts["restart"],
        backoff_s=parts["backoff"],
        other_s=max(0.0, wall - used),
        redone_known=redone_known,
        steps_redone=steps_redone,
    )


def _within(t: float | None, lo: float, hi: float) -> float | None:
    return None if t is None else min(max(t, lo), hi)
