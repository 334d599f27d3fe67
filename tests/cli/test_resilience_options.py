"""The options of ``trainmedic run`` that keep a job alive: values and refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainmedic.cli.resilience_options import build_resilience
from trainmedic.errors import UsageError


def test_defaults_learn_the_timeout_and_restart_three_times() -> None:
    options = build_resilience()
    assert options.max_restarts == 3
    assert options.timeout.fixed_s is None
    assert options.timeout.startup_s == 1800
    assert options.max_total_restarts is None
    assert options.timeout.floor_s == 20
    assert options.timeout.unclear_floor_s == 120
    assert options.timeout.progress_cap_s == 7200
    assert not options.explicit_timeout
    assert options.resume_args is None


def test_the_unclear_bound_follows_a_higher_floor_unless_set() -> None:
    assert build_resilience(timeout_floor_s=5).timeout.unclear_floor_s == 120
    assert build_resilience(timeout_floor_s=300).timeout.unclear_floor_s == 300
    assert build_resilience(timeout_floor_s=5, unclear_timeout_s=30).timeout.unclear_floor_s == 30
    options = build_resilience(max_total_restarts=7, work_cap_s=60)
    assert options.max_total_restarts == 7
    assert options.timeout.progress_cap_s == 60
    with pytest.raises(UsageError, match="--unclear-timeout"):
        build_resilience(unclear_timeout_s=-1)


def test_the_given_values_land_where_they_act() -> None:
    options = build_resilience(
        max_restarts=1,
        timeout_s=30,
        startup_timeout_s=600,
        timeout_floor_s=10,
        time_budget_s=3600,
        grace_s=0,
        backoff_s=0,
        resume_args="--resume {checkpoint}",
        checkpoint_glob="ckpt/*.pt",
        retry_on_exception=True,
    )
    assert options.timeout.fixed_s == 30
    assert options.timeout.startup_s == 600
    assert options.timeout.floor_s == 10
    assert options.explicit_timeout  # --startup-timeout arms the watchdog without steps
    assert not build_resilience(timeout_s=30).explicit_timeout
    assert options.time_budget_s == 3600
    assert (options.grace_s, options.backoff_s) == (0, 0)
    assert options.resume_args == ("--resume", "{checkpoint}")
    assert options.retry_on_exception


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 0},
        {"timeout_s": -1},
        {"startup_timeout_s": float("inf")},
        {"grace_s": -1},
        {"resume_args": "--resume {ckpt}"},
        {"checkpoint_glob": " "},
    ],
)
def test_bad_values_are_usage_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        build_resilience(**kwargs)  # type: ignore[arg-type]


def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2() -> None:
    got = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--timeout", "-5", "--", "true"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 2
    assert got.stderr.count(b"\n") == 1 and b"--timeout" in got.stderr
