"""StepTimeout: healthy runs never trigger, hangs trigger at their bound."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from trainmedic.errors import UsageError
from trainmedic.resilience.silence_evidence import Silence
from trainmedic.resilience.timeouts import StepTimeout, TimeoutConfig

# ---------------------------------------------------------------- builders


class Timeline:
    """Feeds a StepTimeout and checks the verdict before every event.

    Within a gap the deadline only moves when an observation arrives, so
    checking just before each observation finds every hang the watchdog's
    polling would find.
    """

    def __init__(self, timeout: StepTimeout | None = None, **config: Any) -> None:
        self.timeout = timeout or StepTimeout(TimeoutConfig(**config), started_at=0.0)
        self.t = self.timeout.started_at
        self.step_number = 0
        self.hangs: list[float] = []

    def _check(self, t: float) -> None:
        if self.timeout.verdict(t - 1e-6).hung:
            self.hangs.append(t)

    def step(self, after_s: float) -> None:
        self.t += after_s
        self._check(self.t)
        self.step_number += 1
        self.timeout.observe_step(self.t, self.step_number)

    def steps(self, n: int, interval_s: float, rng: random.Random | None = None) -> None:
        for _ in range(n):
            jitter = 1.0 if rng is None else rng.uniform(0.8, 1.2)
            self.step(interval_s * jitter)

    def gap(
        self, duration_s: float, every_s: float | None = None, silence: Silence | None = None
    ) -> None:
        """A step-less period, with the silence classified every ``every_s`` seconds."""
        end = self.t + duration_s
        while every_s is not None and silence is not None and self.t + every_s < end:
            self.t += every_s
            self._check(self.t)
            self.timeout.observe_evidence(self.t, silence)
        self.t = end

    def phase(self, name: str) -> None:
        self._check(self.t)
        self.timeout.observe_phase(self.t, name)

    def first_hang_after(self, limit_s: float = 20_000.0, resolution_s: float = 1.0) -> float:
        """Seconds after now at which the verdict first says hung (polled like the watchdog)."""
        for i in range(1, int(limit_s / resolution_s) + 1):
            if self.timeout.verdict(self.t + i * resolution_s).hung:
                return i * resolution_s
        raise AssertionError("never hung")


MOVING = {"silence": Silence.WORK}
SPINNING = {"silence": Silence.SPINNING}


def p99_bound(intervals: list[float]) -> float:
    ordered = sorted(intervals)
    return max(20.0, 5.0 * ordered[math.ceil(0.99 * len(ordered)) - 1])


# ------------------------------------------------------------- healthy runs


def test_healthy_run_with_periodic_checkpoints_and_evals_never_triggers() -> None:
    rng = random.Random(7)
    tl = Timeline()
    tl.step(300.0)  # imports, dataset indexing: under the 1800 s startup bound
    for step in range(1, 6001):
        if step % 2000 == 0:
            # Evaluation: 10 minutes without steps. The first one survives on
            # progress evidence; the later ones on the learned pause alone.
            if step == 2000:
                tl.gap(600.0, every_s=10.0, **MOVING)
            else:
                tl.gap(600.0)
        elif step % 500 == 0:
            tl.gap(40.0)  # checkpoint write
        tl.steps(1, 0.5, rng)
    assert tl.hangs == []
    assert tl.step_number == 6001
    assert [p.after_step for p in tl.timeout.pauses][:4] == [500, 1000, 1500, 2000]


def test_marked_phases_get_their_own_generous_bound() -> None:
    tl = Timeline()
    tl.steps(50, 1.0)
    learned = tl.timeout.learned_bound_s
    tl.phase("eval")
    tl.gap(1500.0)  # no progress, no steps: fine inside a marked eval (1800 s)
    tl.phase("train")
    tl.steps(10, 1.0)
    assert tl.hangs == []
    assert tl.timeout.learned_bound_s == learned  # the eval interval was not learned
    tl.phase("eval")
    v = tl.timeout.verdict(tl.t + 1)
    assert v.basis == "phase:eval"
    assert v.bound_s == 3000.0  # 2 × the 1500 s the previous eval took
    assert tl.first_hang_after() == 3000.0


def test_a_marked_phase_that_hangs_is_caught_at_the_phase_bound() -> None:
    tl = Timeline()
    tl.steps(20, 1.0)
    tl.phase("checkpoint")
    assert tl.first_hang_after() == 1800.0


# --------------------------------------------------------------------- hangs


def test_hang_triggers_at_the_learned_bound() -> None:
    rng = random.Random(3)
    tl = Timeline()
    intervals = []
    tl.step(60.0)
    for _ in range(300):
        interval = 30.0 * rng.uniform(0.8, 1.2)
        intervals.append(interval)
        tl.step(interval)
    expected = p99_bound(intervals[5:])  # the first 5 are warm-up
    assert expected > 150.0  # the quantile rule, not the floor, decides here
    assert tl.timeout.learned_bound_s == pytest.approx(expected)
    # The job now hangs: no steps, and the stack does not move.
    hung_after = tl.first_hang_after()
    assert expected <= hung_after <= expected + 1.0
    tl.gap(hung_after - 1.0, every_s=10.0, **SPINNING)
    assert tl.hangs == []
    assert tl.timeout.verdict(tl.t + 1.0).hung


def test_fast_steps_are_bounded_by_the_floor_when_the_evidence_is_clear() -> None:
    tl = Timeline()
    tl.steps(500, 0.2)
    assert tl.timeout.learned_bound_s == 20.0
    # No evidence about the silence: the conservative bound.
    assert tl.first_hang_after() == 120.0
    assert tl.timeout.verdict(tl.t + 1).bound_s == 120.0
    tl.timeout.observe_evidence(tl.t + 0.5, Silence.BLOCKED)
    assert tl.first_hang_after(resolution_s=0.25) == 20.0
    v = tl.timeout.verdict(tl.t + 20.0)
    assert v.hung and v.silence == "blocked" and v.bound_s == 20.0
    assert "blocked" in v.reason


@pytest.mark.parametrize(
    "silence", [Silence.BLOCKED, Silence.SPINNING, Silence.PEER_WAIT, Silence.SOURCE_WAIT]
)
def test_every_hang_class_gets_the_floor_as_set(silence: Silence) -> None:
    tl = Timeline(floor_s=5.0)
    tl.steps(100, 0.05)
    last_step = tl.t
    tl.gap(30.0, every_s=0.25, silence=silence)
    assert tl.hangs and tl.hangs[0] - last_step == pytest.approx(5.0, abs=0.26)


def test_work_restarts_the_bound_and_a_hang_follows_the_last_work() -> None:
    tl = Timeline(floor_s=5.0)
    tl.steps(100, 0.05)
    last_step = tl.t
    tl.gap(10.0, every_s=0.25, silence=Silence.WORK)  # a 10 s evaluation, unmarked
    assert tl.hangs == []
    last_work = tl.t - 0.25
    tl.gap(30.0, every_s=0.25, silence=Silence.BLOCKED)
    assert tl.hangs[0] - last_work == pytest.approx(5.0, abs=0.3)
    v = tl.timeout.verdict(tl.hangs[0])
    assert v.extended and v.quiet_s == pytest.approx(5.0, abs=0.3)
    assert v.silent_s == pytest.approx(tl.hangs[0] - last_step)


def test_work_seen_by_a_heartbeat_counts_from_when_it_was_sent() -> None:
    # A loop entered 0.2 s into the silence, shown by a heartbeat read 1 s later and
    # by the windows of the second after: the hang counts from 0.2 s, not from 2 s.
    tl = Timeline(floor_s=5.0)
    tl.steps(100, 0.05)
    seen = tl.t + 0.2
    for after in (1.2, 1.45, 1.7, 1.95, 2.2):
        tl.timeout.observe_evidence(tl.t + after, Silence.WORK, work_at=seen)
    tl.timeout.observe_evidence(tl.t + 2.45, Silence.SPINNING)
    assert tl.timeout.verdict(seen + 5.0 - 0.01).hung is False
    v = tl.timeout.verdict(seen + 5.0)
    assert v.hung and v.quiet_s == pytest.approx(5.0)
    # An older sighting read after a newer one does not move the anchor back.
    tl.timeout.observe_evidence(tl.t + 2.7, Silence.WORK, work_at=seen + 1.0)
    tl.timeout.observe_evidence(tl.t + 2.9, Silence.WORK, work_at=seen + 0.5)
    assert tl.timeout.verdict(seen + 5.9).hung is False
    # A sighting dated after the window that read it counts at the window.
    tl.timeout.observe_evidence(tl.t + 3.0, Silence.WORK, work_at=tl.t + 9.0)
    tl.timeout.observe_evidence(tl.t + 3.25, Silence.SPINNING)
    assert tl.timeout.verdict(tl.t + 3.0 + 4.99).hung is False
    assert tl.timeout.verdict(tl.t + 3.0 + 5.0).hung


def test_unclear_evidence_keeps_the_conservative_bound_and_resets_the_clear_one() -> None:
    tl = Timeline(floor_s=5.0)
    tl.steps(100, 0.05)
    last_step = tl.t
    tl.gap(60.0, every_s=0.25, silence=Silence.UNCLEAR)
    assert tl.hangs == []
    last_unclear = tl.t - 0.25
    # Clear evidence at last: the floor counts from the last unclear window.
    tl.gap(30.0, every_s=0.25, silence=Silence.SPINNING)
    assert tl.hangs[0] - last_unclear == pytest.approx(5.0, abs=0.3)
    # Unclear all along: the conservative bound from the last step.
    tl2 = Timeline(floor_s=5.0)
    tl2.steps(100, 0.05)
    last_step = tl2.t
    tl2.gap(200.0, every_s=0.25, silence=Silence.UNCLEAR)
    assert tl2.hangs[0] - last_step == pytest.approx(120.0, abs=0.3)


def test_a_floor_above_the_conservative_one_raises_both() -> None:
    tl = Timeline(floor_s=300.0)
    tl.steps(100, 0.05)
    assert tl.first_hang_after() == 300.0


def test_a_new_step_forgets_the_evidence_of_the_last_silence() -> None:
    tl = Timeline(floor_s=5.0)
    tl.steps(100, 0.05)
    tl.timeout.observe_evidence(tl.t + 0.1, Silence.BLOCKED)
    tl.steps(1, 1.0)
    assert tl.timeout.verdict(tl.t + 1).silence is None
    assert tl.first_hang_after() == 120.0


def test_no_first_step_is_caught_at_the_startup_bound() -> None:
    tl = Timeline(startup_s=900.0)
    assert tl.first_hang_after() == 900.0
    assert tl.timeout.verdict(10.0).basis == "startup"


# ------------------------------------------------------------------- warm-up


def test_slow_warmup_steps_do_not_raise_the_bound() -> None:
    tl = Timeline()
    tl.step(600.0)
    for compile_s in (240.0, 120.0, 60.0, 30.0, 10.0):  # compilation, autotuning
        tl.step(compile_s)
    tl.steps(300, 1.0)
    assert tl.hangs == []
    assert tl.timeout.learned_bound_s == 20.0  # the floor, not 5 × 240


def test_fast_warmup_steps_do_not_lower_the_bound_or_turn_steps_into_pauses() -> None:
    tl = Timeline()
    tl.step(100.0)
    tl.steps(5, 0.01)  # cached first batches
    tl.steps(200, 40.0)
    assert tl.hangs == []
    assert tl.timeout.pauses == ()
    assert tl.timeout.learned_bound_s == 200.0


def test_warmup_steps_run_under_the_startup_bound() -> None:
    tl = Timeline()
    tl.steps(3, 1.0)
    v = tl.timeout.verdict(tl.t + 1.0)
    assert v.basis == "warmup"
    assert v.bound_s == 1800.0


# ------------------------------------------------------------------ progress


def test_progress_without_steps_extends_the_deadline() -> None:
    tl = Timeline()
    tl.steps(200, 0.5)
    start = tl.t
    tl.gap(3000.0, every_s=10.0, **MOVING)  # a long unmarked evaluation
    assert tl.hangs == []
    v = tl.timeout.verdict(tl.t)
    assert v.extended and not v.hung
    # Progress stops: the hang comes one bound after the last sign of life.
    last_progress = start + 2990.0
    hang_at = tl.t + tl.first_hang_after()
    assert hang_at == pytest.approx(last_progress + 120.0, abs=1.0)


def test_progress_is_capped() -> None:
    tl = Timeline()
    tl.steps(200, 0.5)
    last_step = tl.t
    tl.gap(8000.0, every_s=10.0, **MOVING)
    assert tl.hangs
    assert tl.hangs[0] - last_step == pytest.approx(7200.0, abs=10.0)


def test_spinning_in_place_is_not_progress() -> None:
    tl = Timeline()
    tl.steps(200, 0.5)
    last_step = tl.t
    tl.gap(600.0, every_s=5.0, **SPINNING)
    assert tl.hangs
    assert tl.hangs[0] - last_step == pytest.approx(20.0, abs=5.1)


def test_work_of_any_kind_keeps_a_silence_alive_until_the_cap() -> None:
    tl = Timeline()
    tl.steps(200, 0.5)
    tl.gap(1000.0, every_s=10.0, silence=Silence.WORK)
    assert tl.hangs == []


def test_a_blocked_job_is_hung_at_the_floor() -> None:
    tl = Timeline()
    tl.steps(200, 0.5)
    last_step = tl.t
    tl.gap(300.0, every_s=1.0, silence=Silence.BLOCKED)
    assert tl.hangs and tl.hangs[0] - last_step == pytest.approx(20.0, abs=1.0)


# -------------------------------------------------------------------- pauses


def test_recurring_pauses_are_learned_and_others_are_not_excused() -> None:
    tl = Timeline()
    tl.steps(10, 1.0)
    # Checkpoints after every 500th step take 200 s; the first shows I/O.
    for block in range(4):
        tl.steps(490 if block == 0 else 500, 1.0)
        if block == 0:
            tl.gap(200.0, every_s=10.0, silence=Silence.WORK)
        else:
            tl.gap(200.0)  # no progress evidence at all
    tl.step(1.0)
    assert tl.hangs == []
    assert [p.after_step for p in tl.timeout.pauses] == [500, 1000, 1500, 2000]
    # At a non-checkpoint step a silence gets the normal bound.
    tl.steps(123, 1.0)
    v = tl.timeout.verdict(tl.t + 1.0)
    assert (v.basis, v.bound_s) == ("learned", 120.0)
    # At the next checkpoint step the pause bound applies: 2 × the longest
    # pause (200 s of checkpoint + the 1 s step after it).
    tl.steps(377, 1.0)
    v = tl.timeout.verdict(tl.t + 1.0)
    assert (v.basis, v.bound_s) == ("pause", pytest.approx(402.0))
    assert tl.first_hang_after() == pytest.approx(402.0, abs=1.0)


def test_time_based_checkpoints_are_predicted_within_tolerance() -> None:
    rng = random.Random(11)
    tl = Timeline()
    tl.steps(10, 1.0)
    for block in range(5):
        # A checkpoint every 30 minutes: the step count between them varies by ~1 %.
        tl.steps(1800 + rng.randint(-15, 15), 1.0)
        if block == 0:
            tl.gap(180.0, every_s=10.0, silence=Silence.WORK)
        else:
            tl.gap(180.0)
    assert tl.hangs == []


# ------------------------------------------------------------- fixed, retries


def test_fixed_timeout_ignores_learning_and_progress() -> None:
    tl = Timeline(fixed_s=300.0)
    tl.steps(100, 1.0)
    assert tl.timeout.verdict(tl.t).basis == "fixed"
    last_step = tl.t
    tl.gap(1000.0, every_s=10.0, **MOVING)
    assert tl.hangs[0] - last_step == pytest.approx(300.0, abs=10.0)


def test_bounds_grow_on_each_retry_up_to_the_cap() -> None:
    timeout = StepTimeout(started_at=0.0)
    startup_bounds = []
    for _ in range(6):
        startup_bounds.append(timeout.verdict(1.0).bound_s)
        timeout = timeout.for_next_attempt(started_at=0.0)
    assert startup_bounds == [1800.0, 2700.0, 4050.0, 6075.0, 7200.0, 7200.0]


def test_next_attempt_keeps_what_was_learned_and_warms_up_again() -> None:
    tl = Timeline()
    tl.steps(300, 40.0)
    learned = tl.timeout.learned_bound_s
    nxt = Timeline(tl.timeout.for_next_attempt(started_at=tl.t))
    assert nxt.timeout.learned_bound_s == learned
    nxt.steps(3, 40.0)
    assert nxt.timeout.verdict(nxt.t).basis == "warmup"
    nxt.steps(10, 40.0)
    v = nxt.timeout.verdict(nxt.t)
    assert (v.basis, v.bound_s) == ("learned", pytest.approx(learned * 1.5))


@pytest.mark.parametrize(
    "config",
    [{"floor_s": 0}, {"fixed_s": -5}, {"quantile": 0.1}, {"retry_growth": 0.5}, {"window": 0}],
)
def test_bad_settings_are_usage_errors(config: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        TimeoutConfig(**config)
