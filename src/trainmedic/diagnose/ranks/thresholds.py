"""The limits of the distributed rules, and the collective timeouts the backends default to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankThresholds:
    """Limits of the distributed rules (reasons in docs/diagnosis.md).

    Attributes:
        min_aligned_steps: fewer lockstep steps than this and no straggler is judged.
        holdback_info_share / holdback_warning_share / holdback_error_share: the
            others' wait for the straggler, as a share of step time, for an info /
            a warning / an error.
        holdback_min_s: nor below this many seconds per step (timer noise).
        slowest_share: the straggler must be the slowest rank in at least this
            share of the lockstep steps (noise makes a different rank slowest
            each step).
        lockstep_tolerance: ranks whose steps differ by more than this share of
            the step time (median over steps) do not wait for each other.
        corroboration: without a DataLoader, the straggler's stacks between steps
            must show it preparing data (reading, receiving, transforming) in at
            least this share of the samples.
        clock_slow_ratio: a GPU clocked at or under this share of the other
            GPUs' median is slow.
        throttled_min_share: ... and held down by a slowdown reason in at least
            this share of its readings.
        imbalance_points: GPUs whose mean utilization differs by this many
            percentage points are unevenly loaded ...
        imbalance_busy_pct: ... when the busiest is at least this busy.
        uneven_samples_share: ranks whose mean samples per step differ by more than
            this share get uneven batches.
        timeout_factor / timeout_min_s: the recommended collective timeout is
            this many times the longest legitimate gap between collectives, and
            at least this many seconds.
    """

    min_aligned_steps: int = 20
    holdback_info_share: float = 0.10
    holdback_warning_share: float = 0.20
    holdback_error_share: float = 0.50
    holdback_min_s: float = 0.0005
    slowest_share: float = 0.75
    lockstep_tolerance: float = 0.25
    corroboration: float = 0.5
    clock_slow_ratio: float = 0.90
    throttled_min_share: float = 0.20
    imbalance_points: float = 25.0
    imbalance_busy_pct: float = 50.0
    uneven_samples_share: float = 0.10
    timeout_factor: float = 3.0
    timeout_min_s: float = 300.0


DEFAULT_RANK_THRESHOLDS = RankThresholds()
NCCL_DEFAULT_TIMEOUT_S = 600.0
GLOO_DEFAULT_TIMEOUT_S = 1800.0
