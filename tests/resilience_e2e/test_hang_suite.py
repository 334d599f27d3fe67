"""The hang suite: hangs that must always be caught, within the floor and 1.5 s.

Each job trains 50 ms steps under ``trainmedic run --timeout-floor 5`` and then
hangs on its first attempt: a ``time.sleep`` loop, a lock nobody releases, a
Python busy loop, a gloo collective whose peer sleeps forever, a DataLoader
worker blocked forever reading from a store that never answers. The watchdog
must name the kind of silence, declare the hang between 5 s and 6.5 s after
the job's last sign of life (its own timestamps and the run record, so a busy
machine's slowness elsewhere does not count), restart at once, and the
second attempt must finish. Real processes on the CPU: slow tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from resilience_helpers import left_running
from silence_helpers import (
    FLOOR_S,
    events,
    first,
    record,
    run_scenario,
    slow_server,
    train_step_ends,
)

pytestmark = pytest.mark.slow
LATE_S = 1.5
"""How long after the floor a hang may be declared."""
WORK_AFTER_S = 5.0
"""How long a job may still work after one DataLoader worker's read blocks (the other
workers finishing their batches), pushing the verdict back by as much."""


@pytest.mark.parametrize(
    ("scenario", "silences"),
    [
        ("sleep", {"blocked"}),
        ("lock", {"blocked"}),
        ("busy", {"spinning"}),
        ("gloo", {"blocked", "peer_wait"}),
    ],
)
def test_a_hang_is_caught_within_the_floor_and_restarted_at_once(
    tmp_path: Path, scenario: str, silences: set[str]
) -> None:
    run = run_scenario(tmp_path, scenario)
    assert_caught(run, silences, since=first(run, "hang_start"))


def test_a_dataloader_worker_blocked_forever_in_a_read(tmp_path: Path) -> None:
    with slow_server() as url:
        run = run_scenario(tmp_path, "reader", "--url", f"{url}/never")
    hang = assert_caught(run, {"source_wait"}, since=first(run, "worker_read"), outside=True)
    assert hang["source"].startswith("network") and "127.0.0.1" in hang["source"]
    finding = run.finding("failure.hang")
    assert finding["category"] == "network"
    assert "127.0.0.1" in finding["fix"]


def assert_caught(  # type: ignore[no-untyped-def]
    run, silences: set[str], since: float, outside: bool = False
) -> dict[str, Any]:
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.classes == ["hang", "success"]
    first_attempt, second = run.attempts
    hang = first_attempt["hang"]
    assert hang["silence"] in silences, hang
    # The job's last sign of life: its last train step before the verdict, or the
    # moment it entered the hang, whichever is later.
    detected = first_attempt["detected_at"]
    before = [t for t in train_step_ends(run) if t < detected]
    began = max(since, before[-1])
    late = LATE_S
    if outside and hang["reason"].startswith("work stopped"):
        # The job still worked after the read blocked (the loader's other workers
        # finishing the batches they had begun): the floor runs from that work's end,
        # which the verdict measured; it must have been on time from there.
        assert FLOOR_S - 0.3 <= hang["detected_after_s"] <= FLOOR_S + LATE_S, hang
        late += WORK_AFTER_S
    assert FLOOR_S - 0.3 <= detected - began <= FLOOR_S + late, (detected - began, hang)
    # The first restart of a streak is immediate (jitter included), unless the cause
    # lies outside the job: then the backoff (5 s by default, plus jitter) applies.
    if outside:
        assert 5.0 <= first_attempt["wait_s"] <= 10.0
    else:
        assert first_attempt["wait_s"] <= 0.5
    starts = [e["t"] for e in events(run) if e["event"] == "start" and "rank" not in e]
    assert len(starts) == 2
    assert starts[1] - first_attempt["ended_at"] < first_attempt["wait_s"] + 5.0
    assert [e["event"] for e in events(run)][-1] == "done"
    assert record(run, "hang_detected")[0]["data"]["silence"] == hang["silence"]
    stopped = first_attempt["stop"]
    assert left_running([*stopped["terminated"], *stopped["killed"]]) == []
    assert second["failure_class"] == "success"
    return hang
