"""``trainmedic demo --scenario hang|crash|oom``: detection, restart and resume in a minute."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainmedic.demo.resilience_scenarios import RESILIENCE_SCENARIOS, judge
from trainmedic.record.store import load_run_record
from trainmedic.resilience.incidents import attempts_from_events

DEMO = [sys.executable, "-m", "trainmedic", "demo"]


@pytest.mark.parametrize(
    "name",
    [
        "hang",
        pytest.param("crash", marks=pytest.mark.slow),
        pytest.param("oom", marks=pytest.mark.slow),
    ],
)
def test_a_fault_scenario_is_caught_restarted_and_resumed_within_a_minute(
    tmp_path: Path, name: str
) -> None:
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    got = subprocess.run(
        [*DEMO, "--scenario", name, "--out", str(run_dir)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - t0
    stderr = got.stderr.decode()
    assert got.returncode == 0, stderr
    assert took < 60
    assert f"demo ({name}): as expected" in stderr
    scenario = RESILIENCE_SCENARIOS[name]
    attempts = attempts_from_events(load_run_record(run_dir).events)
    assert [a.failure_class for a in attempts] == [scenario.failure_class, "success"]
    assert judge(scenario, attempts, 0).ok
    if name == "oom":
        assert [r["name"] for r in attempts[0].remedies] == ["micro_batch", "expandable_segments"]
        assert "micro-batch 32 x 2" in got.stdout.decode()
    else:
        assert attempts[1].resume_step == 30
    if name == "hang":
        assert (run_dir / "attempts" / "1" / "stacks.txt").is_file()
        assert "peer.acquire" in stderr


def test_the_fault_scenarios_are_listed() -> None:
    got = subprocess.run([*DEMO, "--list"], capture_output=True, timeout=60, check=True)
    for name in RESILIENCE_SCENARIOS:
        assert f"{name} [fault]:" in got.stdout.decode()


def test_judge_says_what_went_wrong() -> None:
    hang = RESILIENCE_SCENARIOS["hang"]
    assert judge(hang, [], 0).message == "no attempt was recorded"
    assert not judge(hang, [], 0).ok
