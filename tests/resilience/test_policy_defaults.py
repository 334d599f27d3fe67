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


def test_the_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    c = make_classification(FailureClass.SEGFAULT, exit_code=-11, signal=11)
    policy = default_policy(backoff_s=2.0, max_restarts=10, rng=random.Random(1))
    waits = [policy.decide(make_state(c, n), c).wait_s for n in (1, 2, 3)]
    for wait, base in zip(waits, (2.0, 4.0, 8.0), strict=True):
        assert base <= wait <= base + 2.0
    assert default_policy(backoff_s=0).decide(make_state(c), c).wait_s == 0.0
    with pytest.raises(UsageError):
        default_policy(backoff_s=-1)
