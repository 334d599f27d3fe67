"""RestartPolicy: composable stop/retry/wait strategies over RestartState."""

from __future__ import annotations

import random

import pytest

from trainmedic.errors import UsageError
from trainmedic.findings.model import Category
from trainmedic.remedy_api import MICRO_BATCH_DIVISOR_ENV
from trainmedic.resilience.classify import Classification, FailureClass
from trainmedic.resilience.policy import (
    AttemptRecord,
    RestartPolicy,
    RestartState,
    default_policy,
    retry_at_most,
    retry_if_class,
    retry_unless_class,
    stop_after_restarts,
    stop_after_time,
    stop_never,
    stop_on_no_progress,
    stop_on_repeated_hang,
    wait_exponential,
    wait_fixed,
    wait_none,
    wait_random_jitter,
)

# ---------------------------------------------------------------- builders


def make_classification(
    fc: FailureClass = FailureClass.UNKNOWN, location: str | None = None, **details: object
) -> Classification:
    return Classification(
        failure_class=fc,
        category=Category.TIMEOUT,
        confidence="high",
        why=f"{fc.value} happened",
        location=location,
        details=details,
    )


def make_state(
    *attempts: tuple[FailureClass, int | None] | tuple[FailureClass, int | None, str],
    elapsed_s: float = 100.0,
    env: dict[str, str] | None = None,
) -> RestartState:
    """A state after the given attempts: (class, steps reached[, hang location])."""
    state = RestartState(started_at=1000.0, now=1000.0, env=env or {})
    for number, attempt in enumerate(attempts, start=1):
        fc, steps = attempt[0], attempt[1]
        location = attempt[2] if len(attempt) == 3 else None
        record = AttemptRecord(number, make_classification(fc, location), 10.0, steps)
        state = state.with_attempt(record, now=1000.0 + elapsed_s)
    return state


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


# --------------------------------------------------------------------- state


def test_state_counts_attempts_restarts_and_classes() -> None:
    state = make_state(
        (FailureClass.HANG, 10, "a.py:1 in f"), (FailureClass.CUDA_OOM, 20), elapsed_s=250.0
    )
    assert state.attempt_number == 2
    assert state.restarts == 1
    assert state.elapsed_s == 250.0
    assert state.class_counts == {FailureClass.HANG: 1, FailureClass.CUDA_OOM: 1}
    assert state.last_classification is not None
    assert state.last_classification.failure_class is FailureClass.CUDA_OOM
    assert state.attempts[0].hang_location == "a.py:1 in f"
    assert state.attempts[1].hang_location is None


# ---------------------------------------------------------------------- stop


def test_stop_after_restarts_counts_restarts_not_attempts() -> None:
    stop = stop_after_restarts(2)
    assert stop(make_state((FailureClass.HANG, 1), (FailureClass.HANG, 2))) is None
    reason = stop(
        make_state((FailureClass.HANG, 1), (FailureClass.HANG, 2), (FailureClass.HANG, 3))
    )
    assert reason is not None and "--max-total-restarts 2" in reason


def test_stop_after_time() -> None:
    stop = stop_after_time(3600)
    assert stop(make_state((FailureClass.HANG, 1), elapsed_s=3599)) is None
    assert stop(make_state((FailureClass.HANG, 1), elapsed_s=3600)) is not None


def test_stop_combinators() -> None:
    state = make_state((FailureClass.HANG, 1), (FailureClass.HANG, 2), elapsed_s=10)
    restarts, time_budget = stop_after_restarts(1), stop_after_time(60)
    assert (restarts | time_budget)(state) is not None
    assert (restarts & time_budget)(state) is None
    late = make_state((FailureClass.HANG, 1), (FailureClass.HANG, 2), elapsed_s=61)
    both = (restarts & time_budget)(late)
    assert both is not None and " and " in both
    assert (stop_never() | stop_never())(state) is None


def test_stop_on_repeated_hang_needs_the_same_location() -> None:
    stop = stop_on_repeated_hang(2)
    same = make_state((FailureClass.HANG, 5, "t.py:9 in f"), (FailureClass.HANG, 50, "t.py:9 in f"))
    reason = stop(same)
    assert reason is not None and "t.py:9 in f" in reason
    moved = make_state(
        (FailureClass.HANG, 5, "t.py:9 in f"), (FailureClass.HANG, 50, "t.py:3 in g")
    )
    assert stop(moved) is None
    unknown = make_state((FailureClass.HANG, 5), (FailureClass.HANG, 50))
    assert stop(unknown) is None


def test_stop_on_no_progress() -> None:
    stop = stop_on_no_progress(2)
    assert stop(make_state((FailureClass.CUDA_OOM, 100), (FailureClass.CUDA_OOM, 100))) is None
    stalled = make_state(
        (FailureClass.CUDA_OOM, 100), (FailureClass.CUDA_OOM, 90), (FailureClass.CUDA_OOM, 100)
    )
    reason = stop(stalled)
    assert reason is not None and "step 100" in reason
    advancing = make_state(
        (FailureClass.HANG, 100), (FailureClass.HANG, 90), (FailureClass.HANG, 300)
    )
    assert stop(advancing) is None
    unknown = make_state(
        (FailureClass.HANG, None), (FailureClass.HANG, None), (FailureClass.HANG, None)
    )
    assert stop(unknown) is None
    never_stepped = make_state((FailureClass.CUDA_OOM, 0), (FailureClass.CUDA_OOM, 0))
    assert stop(never_stepped) is not None


def test_invalid_stop_settings() -> None:
    with pytest.raises(UsageError):
        stop_after_restarts(-1)
    with pytest.raises(UsageError):
        stop_after_time(0)


# --------------------------------------------------------------------- retry


def test_retry_rules_by_class() -> None:
    state = make_state((FailureClass.HANG, 1))
    only_oom = retry_if_class(FailureClass.CUDA_OOM)
    assert only_oom(state, make_classification(FailureClass.CUDA_OOM))
    assert not only_oom(state, make_classification(FailureClass.HANG))
    no_bugs = retry_unless_class(FailureClass.USER_EXCEPTION)
    assert no_bugs(state, make_classification(FailureClass.HANG))
    assert not no_bugs(state, make_classification(FailureClass.USER_EXCEPTION))
    either = only_oom | retry_if_class(FailureClass.HANG)
    assert either(state, make_classification(FailureClass.HANG))
    both = no_bugs & only_oom
    assert not both(state, make_classification(FailureClass.HANG))
    assert both.describe() == "retry_unless_class(user_exception) & retry_if_class(cuda_oom)"


def test_retry_at_most_limits_one_class() -> None:
    rule = retry_at_most(FailureClass.CUDA_OOM, 2)
    two = make_state((FailureClass.CUDA_OOM, 1), (FailureClass.CUDA_OOM, 2))
    three = make_state(
        (FailureClass.CUDA_OOM, 1), (FailureClass.CUDA_OOM, 2), (FailureClass.CUDA_OOM, 3)
    )
    assert rule(two, make_classification(FailureClass.CUDA_OOM))
    assert not rule(three, make_classification(FailureClass.CUDA_OOM))
    assert rule(three, make_classification(FailureClass.HANG))


# ---------------------------------------------------------------------- wait


def test_exponential_backoff_with_cap() -> None:
    wait = wait_exponential(initial=5, base=2, cap=60)
    waits = [wait(make_state(*[(FailureClass.HANG, i) for i in range(n)])) for n in range(1, 7)]
    assert waits == [5, 10, 20, 40, 60, 60]
    huge = make_state(*[(FailureClass.HANG, i) for i in range(200)])
    assert wait(huge) == 60


def test_waits_add_up_and_jitter_stays_in_range() -> None:
    state = make_state((FailureClass.HANG, 1), (FailureClass.HANG, 2))
    jitter = wait_random_jitter(3.0, random.Random(1))
    combined = wait_exponential(5, 2, 60) + jitter + wait_fixed(1) + wait_none()
    values = [combined(state) for _ in range(200)]
    assert all(11.0 <= v <= 14.0 for v in values)
    assert max(values) - min(values) > 2.5  # really random, not a constant


# -------------------------------------------------------------------- policy


def test_default_policy_restarts_a_hang_at_once_with_a_little_jitter() -> None:
    sleep = RecordingSleep()
    policy = default_policy(sleep=sleep, rng=random.Random(5))
    state = make_state((FailureClass.HANG, 100, "t.py:1 in f"))
    decision = policy.decide(state, state.attempts[-1].classification)
    assert decision.restart
    assert 0.0 <= decision.wait_s <= 0.5
    assert decision.reason.startswith("restart 1 after hang")
    policy.sleep(decision.wait_s)
    assert sleep.calls == [decision.wait_s]


def test_default_policy_does_not_restart_bugs_bad_commands_or_outside_stops() -> None:
    policy = default_policy(sleep=RecordingSleep())
    for fc in (FailureClass.USER_EXCEPTION, FailureClass.BAD_COMMAND, FailureClass.PREEMPTED):
        decision = policy.decide(make_state((fc, 3)), make_classification(fc))
        assert not decision.restart
        assert decision.reason.startswith(f"{fc.value} is not restarted")
        assert decision.remedies == ()


def test_success_is_never_restarted() -> None:
    policy = default_policy()
    decision = policy.decide(
        make_state((FailureClass.SUCCESS, 10)), make_classification(FailureClass.SUCCESS)
    )
    assert (decision.restart, decision.reason) == (False, "the job finished")


def test_default_policy_stops_after_three_restarts() -> None:
    policy = default_policy()
    attempts = [(FailureClass.HANG, 100 * n, f"t.py:{n} in f") for n in range(1, 5)]
    assert policy.decide(make_state(*attempts[:3]), make_classification(FailureClass.HANG)).restart
    decision = policy.decide(make_state(*attempts), make_classification(FailureClass.HANG))
    assert not decision.restart
    assert "--max-restarts 3" in decision.reason


def test_time_budget_in_the_default_policy() -> None:
    policy = default_policy(max_total_s=600)
    decision = policy.decide(
        make_state((FailureClass.HANG, 1), elapsed_s=601), make_classification(FailureClass.HANG)
    )
    assert not decision.restart
    assert "budget" in decision.reason


def test_decision_carries_remedies_and_the_next_environment() -> None:
    policy = RestartPolicy(wait=wait_none(), sleep=RecordingSleep())
    state = make_state((FailureClass.CUDA_OOM, 10), env={"PATH": "/bin"})
    decision = policy.decide(state, make_classification(FailureClass.CUDA_OOM))
    assert decision.restart and decision.wait_s == 0.0
    assert [r.name for r in decision.remedies] == ["micro_batch", "expandable_segments"]
    assert "with micro_batch, expandable_segments" in decision.reason
    env = decision.next_env(state.env)
    assert env[MICRO_BATCH_DIVISOR_ENV] == "2"
    assert env["PATH"] == "/bin"
    assert state.env == {"PATH": "/bin"}  # the state's environment is untouched


def test_a_custom_policy_composes_its_own_rules() -> None:
    policy = RestartPolicy(
        stop=stop_after_restarts(10) | stop_on_no_progress(2),
        retry=retry_if_class(FailureClass.HANG, FailureClass.COLLECTIVE_TIMEOUT),
        wait=wait_fixed(30),
        remedies=lambda state, c: [],
        sleep=RecordingSleep(),
    )
    hang = make_classification(FailureClass.HANG)
    assert policy.decide(make_state((FailureClass.HANG, 5)), hang).wait_s == 30
    assert not policy.decide(
        make_state((FailureClass.CUDA_OOM, 5)), make_classification(FailureClass.CUDA_OOM)
    ).restart
    stalled = make_state((FailureClass.HANG, 5), (FailureClass.HANG, 5), (FailureClass.HANG, 4))
    decision = policy.decide(stalled, hang)
    assert not decision.restart and "no further" in decision.reason
