"""Goodput: a run's wall time split over its attempts' timelines."""

from __future__ import annotations

import pytest

from trainmedic.resilience.goodput import AttemptTimes, compute_goodput


def make_hang_then_success() -> list[AttemptTimes]:
    """Attempt 1: start-up 2 s, 30 steps over 3 s, hang for 10 s, 1 s to stop it.
    5 s of backoff and 0.5 s of restarting. Attempt 2 resumes at step 20 and
    does 20 steps over 4 s after a 2 s start-up, then shuts down in 0.5 s."""
    return [
        AttemptTimes(
            started_at=100.0,
            ended_at=116.0,
            first_step_start=102.0,
            last_step_end=105.0,
            hang_started_at=105.0,
            detected_at=115.0,
            steps=30,
            resume_step=None,
            wait_s=5.0,
        ),
        AttemptTimes(
            started_at=121.5,
            ended_at=128.0,
            first_step_start=123.5,
            last_step_end=127.5,
            steps=20,
            resume_step=20,
            succeeded=True,
        ),
    ]


def test_a_hang_and_a_resumed_attempt_split_exactly() -> None:
    g = compute_goodput(make_hang_then_success(), run_started_at=100.0, run_ended_at=128.0)
    assert g.wall_s == 28.0
    assert g.startup_s == pytest.approx(4.0)
    assert g.detect_s == pytest.approx(10.0)
    assert g.restart_s == pytest.approx(1.0 + 0.5)
    assert g.backoff_s == pytest.approx(5.0)
    # Attempt 2 redid steps 21..30 (10 of its 20 steps, half of its 4 s).
    assert g.steps_redone == 10
    assert g.redone_s == pytest.approx(2.0)
    assert g.productive_s == pytest.approx(3.0 + 2.0)
    assert g.other_s == pytest.approx(0.5)
    parts = (
        g.productive_s,
        g.startup_s,
        g.redone_s,
        g.lost_s,
        g.detect_s,
        g.restart_s,
        g.backoff_s,
        g.other_s,
    )
    assert sum(parts) == pytest.approx(g.wall_s)
    assert g.share == pytest.approx(5.0 / 28.0)
    assert g.redone_known


def test_an_unknown_resume_point_counts_as_productive_and_says_so() -> None:
    attempts = make_hang_then_success()
    attempts[1] = AttemptTimes(**{**attempts[1].__dict__, "resume_step": None})
    g = compute_goodput(attempts, 100.0, 128.0)
    assert g.redone_s == 0.0
    assert g.productive_s == pytest.approx(7.0)
    assert not g.redone_known


def test_a_crash_loses_the_time_since_its_last_step() -> None:
    crash = AttemptTimes(
        started_at=0.0, ended_at=10.0, first_step_start=1.0, last_step_end=8.0, steps=7
    )
    again = AttemptTimes(
        started_at=10.0,
        ended_at=20.0,
        first_step_start=11.0,
        last_step_end=19.0,
        steps=8,
        resume_step=0,
        succeeded=True,
    )
    g = compute_goodput([crash, again], 0.0, 20.0)
    assert g.lost_s == pytest.approx(2.0)
    assert g.steps_redone == 7  # it restarted from scratch
    assert g.redone_s == pytest.approx(8.0 * 7 / 8)
    assert g.detect_s == 0.0


def test_a_hang_before_the_first_step_is_start_up_then_detection() -> None:
    hung = AttemptTimes(started_at=0.0, ended_at=40.0, hang_started_at=5.0, detected_at=35.0)
    g = compute_goodput([hung], 0.0, 40.0)
    assert g.startup_s == pytest.approx(5.0)
    assert g.detect_s == pytest.approx(30.0)
    assert g.restart_s == pytest.approx(5.0)
    assert g.productive_s == 0.0
