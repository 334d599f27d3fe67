"""The pause suite: long silences of healthy jobs that must never be taken for a hang.

Each job trains 50 ms steps under ``trainmedic run --timeout-floor 5`` and then
goes silent for longer than the floor while it works: an unmarked evaluation,
a 1.6 GB checkpoint written and synced, one long native computation on every
core, DataLoader workers waiting on a slow remote store, a rank evaluating
while its peer waits in a barrier. None may be restarted. Real processes on
the CPU, so all are slow tests; each also checks that its silence really
outlasted the floor (steps.jsonl), or it would prove nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from silence_helpers import (
    FLOOR_S,
    first,
    longest_gap,
    record,
    run_scenario,
    slow_server,
    train_step_ends,
)

pytestmark = pytest.mark.slow


def assert_no_hang(run, pause_from: float, pause_to: float) -> None:  # type: ignore[no-untyped-def]
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.classes == ["success"]
    assert record(run, "hang_detected") == []
    # The silence really was longer than the floor: without a step for more than 5 s.
    gap = longest_gap(train_step_ends(run), pause_from - 1.0, pause_to + 1.0)
    assert gap > FLOOR_S + 1.0, f"the pause lasted only {gap:.1f} s"


def test_an_unmarked_10_s_evaluation(tmp_path: Path) -> None:
    run = run_scenario(tmp_path, "eval")
    assert_no_hang(run, first(run, "pause_start"), first(run, "pause_end"))


def test_a_1_6_gb_checkpoint_written_and_synced(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    if free < 4 * 2**30:
        pytest.skip(f"only {free / 2**30:.1f} GiB free under {tmp_path}; the test writes 1.6 GB")
    run = run_scenario(tmp_path, "save", "--dir", tmp_path)
    assert_no_hang(run, first(run, "pause_start"), first(run, "pause_end"))


def test_one_long_native_call_on_every_core(tmp_path: Path) -> None:
    run = run_scenario(tmp_path, "eigh")
    assert_no_hang(run, first(run, "pause_start"), first(run, "pause_end"))


def test_dataloader_workers_on_a_slow_remote_store(tmp_path: Path) -> None:
    with slow_server() as url:
        run = run_scenario(tmp_path, "remote", "--url", f"{url}/slow")
    assert_no_hang(run, first(run, "pause_start"), first(run, "pause_end"))


def test_rank_0_evaluates_while_rank_1_waits_in_a_barrier(tmp_path: Path) -> None:
    run = run_scenario(tmp_path, "barrier")
    assert_no_hang(run, first(run, "pause_start"), first(run, "pause_end"))
