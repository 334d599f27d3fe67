"""The policy ``trainmedic run`` uses: what it restarts and how long it waits."""

from __future__ import annotations

import random

import pytest

from trainmedic.errors import UsageError
from trainmedic.findings.model import Category
from trainmedic.resilience.classify import Classification, FailureClass
from trainmedic.resilience.policy import (
    AttemptRecord,
    RestartState,
    default_policy,
    is_own_exit,
    points_outside,
)


def make_classification(
    fc: FailureClass,
    exit_code: int | None = 1,
    signal: int | None = None,
    category: Category = Category.TIMEOUT,
) -> Classification:
    return Classification(fc, category, "low", "why", exit_code=exit_code, signal=signal)


def make_state(c: Classification, attempts: int = 1) -> RestartState:
    records = tuple(
        AttemptRecord(n, c, 10.0, steps_reached=100 * n) for n in range(1, attempts + 1)
    )
    return RestartState(started_at=0.0, now=10.0, attempts=records)


def test_a_programs_own_non_zero_exit_is_not_restarted_by_default() -> None:
    own = make_classification(FailureClass.UNKNOWN, exit_code=3)
    assert is_own_exit(own)
    decision = default_policy(backoff_s=0).decide(make_state(own), own)
    assert not decision.restart
    assert "retry_unless_own_exit" in decision.reason


@pytest.mark.parametrize(
    "c",
    [
        make_classification(FailureClass.UNKNOWN, exit_code=-9, signal=9),  # SIGKILL from outside
        make_classification(FailureClass.UNKNOWN, category=Category.NETWORK),  # a lost peer
        make_classification(FailureClass.SEGFAULT, exit_code=-11, signal=11),
        make_classification(FailureClass.HANG, exit_code=-15, signal=15),
    ],
)
def test_faults_are_restarted(c: Classification) -> None:
    assert not is_own_exit(c)
    assert default_policy(backoff_s=0).decide(make_state(c), c).restart


def test_retry_on_exception_restarts_bugs_and_own_exits_but_not_bad_commands() -> None:
    policy = default_policy(backoff_s=0, retry_on_exception=True)
    for fc in (FailureClass.USER_EXCEPTION, FailureClass.UNKNOWN):
        c = make_classification(fc, exit_code=1)
        assert policy.decide(make_state(c), c).restart
    bad = make_classification(FailureClass.BAD_COMMAND, exit_code=127)
    assert not policy.decide(make_state(bad), bad).restart


def test_the_first_restart_is_immediate_and_the_backoff_grows_from_the_second() -> None:
    c = make_classification(FailureClass.SEGFAULT, exit_code=-11, signal=11)
    policy = default_policy(backoff_s=2.0, max_restarts=10, rng=random.Random(1))
    # Attempts that got no further than the first (no progress): a streak of failures.
    waits = [policy.decide(stalled_state(c, n), c).wait_s for n in (1, 2, 3, 4)]
    assert 0.0 <= waits[0] <= 0.5
    for wait, base in zip(waits[1:], (2.0, 4.0, 8.0), strict=True):
        assert base <= wait <= base + 2.0
    assert default_policy(backoff_s=0).decide(make_state(c), c).wait_s == 0.0
    with pytest.raises(UsageError):
        default_policy(backoff_s=-1)


def test_an_attempt_that_trained_for_a_while_resets_the_backoff_and_the_budget() -> None:
    c = make_classification(FailureClass.SEGFAULT, exit_code=-11, signal=11)
    policy = default_policy(backoff_s=5.0, max_restarts=3, rng=random.Random(2))
    # Twenty crashes, each after 30 s of training further than the one before.
    records = tuple(
        AttemptRecord(n, c, 35.0, steps_reached=600 * n, trained_s=30.0) for n in range(1, 21)
    )
    state = RestartState(started_at=0.0, now=700.0, attempts=records)
    assert state.failures_without_progress == 1
    decision = policy.decide(state, c)
    assert decision.restart and decision.wait_s <= 0.5
    # Four crashes in a row that got nowhere (crashed at start-up): the budget is spent.
    stalled = (*records, *(AttemptRecord(20 + n, c, 2.0) for n in range(1, 4)))
    state = RestartState(started_at=0.0, now=800.0, attempts=stalled)
    assert state.failures_without_progress == 4
    decision = policy.decide(state, c)
    assert not decision.restart and "3 failures in a row" not in decision.reason
    assert "4 failures in a row without progress (--max-restarts 3)" in decision.reason


def test_a_total_cap_counts_every_restart() -> None:
    c = make_classification(FailureClass.SEGFAULT, exit_code=-11, signal=11)
    records = tuple(
        AttemptRecord(n, c, 35.0, steps_reached=600 * n, trained_s=30.0) for n in range(1, 6)
    )
    state = RestartState(started_at=0.0, now=200.0, attempts=records)
    assert default_policy(backoff_s=0).decide(state, c).restart
    capped = default_policy(backoff_s=0, max_total_restarts=4).decide(state, c)
    assert not capped.restart and "--max-total-restarts 4" in capped.reason


def test_short_or_repeated_training_is_no_progress() -> None:
    c = make_classification(FailureClass.SEGFAULT, exit_code=-11, signal=11)
    short = RestartState(
        started_at=0.0,
        now=10.0,
        attempts=(
            AttemptRecord(1, c, 30.0, steps_reached=100, trained_s=25.0),
            AttemptRecord(2, c, 9.0, steps_reached=150, trained_s=5.0),  # too short
            AttemptRecord(3, c, 30.0, steps_reached=100, trained_s=25.0),  # not further
            AttemptRecord(4, c, 70.0),  # no steps seen, but ran a while
        ),
    )
    assert [short.made_progress(i) for i in range(4)] == [True, False, False, True]


@pytest.mark.parametrize(
    ("c", "outside"),
    [
        (make_classification(FailureClass.HANG, category=Category.NETWORK), True),
        (make_classification(FailureClass.HANG, category=Category.IO), True),
        (make_classification(FailureClass.CUDA_ERROR, category=Category.HARDWARE_FAULT), True),
        (make_classification(FailureClass.HANG), False),
        (make_classification(FailureClass.UNKNOWN, category=Category.NETWORK), False),
    ],
)
def test_a_cause_outside_the_job_backs_off_from_the_first_failure(
    c: Classification, outside: bool
) -> None:
    assert points_outside(c) is outside
    wait = default_policy(backoff_s=4.0, rng=random.Random(3)).decide(make_state(c), c).wait_s
    assert (4.0 <= wait <= 8.0) if outside else (wait <= 0.5)


def stalled_state(c: Classification, attempts: int) -> RestartState:
    records = tuple(AttemptRecord(n, c, 3.0, steps_reached=10) for n in range(1, attempts + 1))
    return RestartState(started_at=0.0, now=10.0, attempts=records)
