"""The profiler window on CPU, with the real torch.profiler (trainmedic.probe.profile_window):
when it opens, what it records and writes, what it reports it cost, and when it stays shut."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainmedic.probe.parts import InjectedFault, Parts
from trainmedic.probe.profile_window import (
    ACTIVE_STEPS,
    FIRST_STEP,
    RECHECK_STEPS,
    REPEAT_S,
    WARMUP_STEPS,
    ProfileWindow,
)
from trainmedic.record.layout import PROFILES_DIR
from trainmedic.traces.kineto import read_trace

torch = pytest.importorskip("torch")

STEP_S = 0.01


class Job:
    """Training steps of a small model, each ended at the time given (seconds)."""

    def __init__(self, tmp_path: Path, mode: str = "always", fault: bool = False) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        parts = Parts((), ("profiler",) if fault else (), lambda part, exc, tb: None)
        self.part = parts["profiler"]
        self.window = ProfileWindow(
            torch, self.part, str(tmp_path), "pid1", uses_cuda=lambda: False,
            capturing=lambda: False, send_event=lambda *e: self.events.append(e), mode=mode,
        )  # fmt: skip
        self.model = torch.nn.Linear(32, 32)
        self.t = 0.0

    def steps(self, n: int, step_s: float = STEP_S, phase: str = "train") -> None:
        for _ in range(n):
            self.model(torch.randn(8, 32)).sum().backward()
            self.t += step_s
            self.window.step_ended(SimpleNamespace(phase=phase, t_end=self.t))  # type: ignore[arg-type]


def traces(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / PROFILES_DIR).glob("*.json.gz"))


def test_a_window_opens_after_the_warm_up_and_records_its_steps(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps(FIRST_STEP - 1)
    assert not job.window.open
    job.steps(1)
    assert job.window.open
    job.steps(WARMUP_STEPS)
    assert torch.autograd.profiler._is_profiler_enabled  # recording, past its warm-up
    job.steps(ACTIVE_STEPS)
    assert not job.window.open and not torch.autograd.profiler._is_profiler_enabled
    job.window.finish()  # waits for the trace to be written
    (path,) = traces(tmp_path)
    assert path.name == f"pid1-step{FIRST_STEP}.json.gz"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    summary = read_trace(path)
    assert len(summary.steps) == ACTIVE_STEPS and summary.with_stack
    (kind, message, data) = job.events[-1]
    assert kind == "profile_window" and f"{ACTIVE_STEPS} steps profiled" in message
    assert data["path"] == f"{PROFILES_DIR}/{path.name}" and data["bytes"] == path.stat().st_size
    assert data["steps"] == ACTIVE_STEPS and data["first_step"] == FIRST_STEP
    assert data["step_s_before"] == pytest.approx(STEP_S)
    # the steps' ends are given here, so the profiled steps cost nothing extra: the
    # cost is the profiler's start and stop, timed for real
    assert data["extra_s"] == pytest.approx(0.0, abs=1e-9)
    # each of the three figures is rounded to 1 µs on its own, so their sum may differ by 1.5 µs
    assert data["cost_s"] == pytest.approx(data["start_s"] + data["stop_s"], abs=1.6e-6)
    assert data["start_s"] > 0 and data["stop_s"] > 0 and data["next_in_s"] >= REPEAT_S


def test_the_next_window_waits_its_time_and_longer_when_the_last_cost_much(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    job.steps(FIRST_STEP + WARMUP_STEPS + ACTIVE_STEPS)
    job.window.finish()
    wait = job.events[-1][2]["next_in_s"]
    job.steps(5, step_s=(wait - 1.0) / 5)  # up to a second before it is due
    assert not job.window.open
    job.steps(1, step_s=2.0)
    assert job.window.open
    job.steps(WARMUP_STEPS + ACTIVE_STEPS)
    job.window.finish()
    assert len(traces(tmp_path)) == 2 and job.window.windows == 2


def test_a_profiled_step_that_costs_more_is_counted_and_pushes_the_next_window(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    job.steps(FIRST_STEP)
    job.steps(WARMUP_STEPS + ACTIVE_STEPS, step_s=STEP_S * 11)  # 0.1 s more each
    job.window.finish()
    data = job.events[-1][2]
    assert data["extra_s"] == pytest.approx(0.1 * (WARMUP_STEPS + ACTIVE_STEPS))
    assert data["step_s_profiled"] == pytest.approx(STEP_S * 11)
    assert data["next_in_s"] == pytest.approx(max(REPEAT_S, data["cost_s"] / 0.01), abs=0.2)


def test_long_steps_end_the_window_once_one_is_recorded(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps(FIRST_STEP)
    job.steps(WARMUP_STEPS + 1, step_s=30.0)
    assert not job.window.open
    job.window.finish()
    (path,) = traces(tmp_path)
    assert len(read_trace(path).steps) == 1 and job.events[-1][2]["steps"] == 1


def test_no_window_while_the_job_profiles_itself(tmp_path: Path) -> None:
    job = Job(tmp_path)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        job.steps(FIRST_STEP + 3)
    assert not job.window.open and job.window.windows == 0
    job.steps(RECHECK_STEPS - 4)  # asked at step FIRST_STEP: next at FIRST_STEP + RECHECK_STEPS
    assert not job.window.open
    job.steps(1)
    assert job.window.open  # asked again, the job's profiler gone
    job.steps(WARMUP_STEPS + ACTIVE_STEPS)
    job.window.finish()
    assert len(traces(tmp_path)) == 1


def test_auto_needs_cuda_and_eval_steps_do_not_count(tmp_path: Path) -> None:
    job = Job(tmp_path, mode="auto")
    job.steps(FIRST_STEP + RECHECK_STEPS + 1)
    assert not job.window.open
    cpu = Job(tmp_path, mode="always")
    cpu.steps(FIRST_STEP + 5, phase="eval")
    assert not cpu.window.open and cpu.window.steps == 0


def test_a_window_open_at_exit_is_closed_and_written(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps(FIRST_STEP + WARMUP_STEPS + 2)
    assert job.window.open
    job.window.finish()
    assert not torch.autograd.profiler._is_profiler_enabled
    (path,) = traces(tmp_path)
    assert len(read_trace(path).steps) >= 1


def test_an_error_stops_the_profiler_it_opened(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.steps(FIRST_STEP)
    assert job.window.open
    job.window.stop_quietly()
    assert not job.window.open and not torch.autograd.profiler._is_profiler_enabled
    faulty = Job(tmp_path, fault=True)
    with pytest.raises(InjectedFault):
        faulty.steps(1)


def test_a_trace_that_cannot_be_written_is_an_event_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / PROFILES_DIR).write_text("a file where the folder would be")
    job = Job(tmp_path)
    job.steps(FIRST_STEP + WARMUP_STEPS + ACTIVE_STEPS)
    job.window.finish()
    (kind, message, data) = job.events[-1]
    assert kind == "profile_window" and "could not be written" in message
    assert "path" not in data and data["error"].startswith(("FileExistsError", "NotADirectory"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [PROFILES_DIR]
    assert not job.window.open and job.window.windows == 1
