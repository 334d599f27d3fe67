"""The live view: numbers from recent steps, warnings once certain, rendered at a fixed width."""

from __future__ import annotations

import pytest

from support import builders
from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import HostSample, RunEvent, StepRecord
from trainmedic.supervise.live.status import MIN_CERTAIN_STEPS, LiveAggregate
from trainmedic.supervise.live.view import LiveView, plain_line, render_panel
from trainmedic.supervise.loop.attempt_state import AttemptNow, AttemptState

GIB = 1024**3


def make_step(
    n: int, duration: float = 0.1, wait: float = 0.0, pid: int = 1, **kw: object
) -> StepRecord:
    return StepRecord(
        step=n,
        t=100.0 + n * duration,
        duration_s=duration,
        data_wait_s=wait,
        samples=32,
        pid=pid,
        **kw,
    )  # type: ignore[arg-type]


def make_gpu(t: float, util: float, used: int = 10 * GIB, **kw: object) -> GpuSample:
    fields: dict[str, object] = {"temperature_c": 60.0, **kw}
    return builders.make_gpu(
        t, utilization_gpu_pct=util, memory_total_bytes=80 * GIB, memory_used_bytes=used, **fields
    )


def make_host(cpu_pct: float) -> HostSample:
    return builders.make_host(1.0, job_cpu_pct=cpu_pct, usable_cores=8.0, mem_available_bytes=GIB)


def test_rates_and_shares_come_from_the_recent_steps() -> None:
    agg = LiveAggregate(started_at=100.0)
    for n in range(1, 11):
        agg.add_step(make_step(n, duration=0.1, wait=0.04))
    agg.add_host(make_host(250.0))
    s = agg.status(now=130.0)
    assert s.steps == 10
    assert s.steps_per_s == pytest.approx(10.0)
    assert s.samples_per_s == pytest.approx(320.0)
    assert s.data_wait_share == pytest.approx(0.4)
    assert s.job_cpu_cores == 2.5
    assert s.elapsed_s == 30.0
    assert s.warnings == ()  # 40 % is no warning, and too few steps to be sure anyway


def test_an_input_bound_run_warns_once_enough_steps_are_seen() -> None:
    agg = LiveAggregate(started_at=0.0)
    for n in range(1, MIN_CERTAIN_STEPS):
        agg.add_step(make_step(n, wait=0.08))
    assert agg.status(1.0).warnings == ()
    agg.add_step(make_step(MIN_CERTAIN_STEPS, wait=0.08))
    (warning,) = agg.status(1.0).warnings
    assert warning.startswith("input-bound: 80% of step time waiting for data")


def test_the_lead_process_is_rank_zero_and_samples_add_up_over_processes() -> None:
    agg = LiveAggregate(started_at=0.0)
    for n in range(1, 6):
        agg.add_step(make_step(n, pid=11, rank=1))
        agg.add_step(make_step(n, duration=0.2, pid=10, rank=0))
    s = agg.status(1.0)
    assert s.steps_per_s == pytest.approx(5.0)  # rank 0's pace
    assert s.samples_per_s == pytest.approx(320.0 + 160.0)
    assert s.processes == 2


def test_evaluation_steps_do_not_count_as_training() -> None:
    agg = LiveAggregate(started_at=0.0)
    agg.add_step(make_step(1))
    agg.add_step(StepRecord(step=1, t=5.0, duration_s=3.0, pid=1, phase="eval"))
    s = agg.status(1.0)
    assert (s.steps, s.phase) == (1, "eval")


def test_gpu_warnings_need_a_window_of_readings() -> None:
    agg = LiveAggregate(started_at=0.0)
    for n in range(1, MIN_CERTAIN_STEPS + 1):
        agg.add_step(make_step(n))
    for t in range(12):
        agg.add_gpu(make_gpu(float(t), util=15.0, used=79 * GIB, clock_event_reasons=0x40))
    warnings = agg.status(12.0).warnings
    assert any(w.startswith("GPU 0 mostly idle: 15% busy") for w in warnings)
    assert any(w.startswith("GPU 0 memory nearly full: 79.0 of 80.0 GiB") for w in warnings)
    assert any("slowed by heat or power" in w for w in warnings)


def test_probe_errors_and_exceptions_become_warnings() -> None:
    agg = LiveAggregate(started_at=0.0)
    agg.add_event(RunEvent(t=1.0, kind="probe_error", message="probe part 'cuda' disabled"))
    agg.add_event(RunEvent(t=1.0, kind="exception", message="ValueError: bad", pid=7))
    agg.add_event(RunEvent(t=1.0, kind="process_start", message="ignored"))
    assert agg.status(2.0).warnings == (
        "probe: probe part 'cuda' disabled",
        "pid 7: ValueError: bad",
    )


def test_plain_line() -> None:
    agg = LiveAggregate(started_at=0.0)
    for n in range(1, 5):
        agg.add_step(make_step(n, duration=0.25, wait=0.05))
    agg.add_gpu(make_gpu(1.0, util=97.0))
    line = plain_line(agg.status(83.0))
    assert line == (
        "trainmedic [0:01:23] step 4 | 4.00 steps/s | 128.0 samples/s | data wait 20% "
        "| GPU0 97% 10.0/80.0 GiB 60°C"
    )


def test_the_line_says_which_attempt_once_the_job_was_restarted() -> None:
    agg = LiveAggregate(started_at=0.0)
    agg.add_step(make_step(1, duration=0.25, wait=0.05))
    agg.attempt_changed(AttemptNow(1, AttemptState.RUNNING, 0.0))
    assert "attempt" not in plain_line(agg.status(1.0))  # the usual case says nothing
    agg.attempt_changed(AttemptNow(1, AttemptState.BACKING_OFF, 2.0))
    assert plain_line(agg.status(3.0)).endswith("| attempt 1 backing off")
    agg.attempt_changed(AttemptNow(2, AttemptState.RUNNING, 4.0))
    status = agg.status(5.0)
    assert (status.attempt, status.attempt_state) == (2, "running")
    assert plain_line(status).endswith("| attempt 2 running")


def test_panel_renders_within_the_width_given() -> None:
    agg = LiveAggregate(started_at=0.0)
    for n in range(1, 25):
        agg.add_step(make_step(n, wait=0.09))
    agg.add_gpu(make_gpu(1.0, util=12.0))
    lines = render_panel(agg.status(61.0), "train", width=72, color_system=None)
    assert all(len(line) <= 72 for line in lines)
    text = "\n".join(lines)
    assert "trainmedic · train · 0:01:01" in lines[0]
    assert "step 24" in text and "10.00 steps/s" in text and "data wait 90%" in text
    assert "▲ input-bound: 90% of step time waiting for data" in text


def test_the_view_shows_a_panel_or_a_line_through_its_outputs() -> None:
    agg = LiveAggregate(started_at=0.0)
    agg.add_step(make_step(1))
    shown: list[object] = []
    panel = LiveView(
        agg,
        "panel",
        "train",
        lambda lines: shown.append(lines) or True,
        lambda line: False,
        lambda: None,
        width=lambda: 60,
        color_system=None,
        wall=lambda: 10.0,
    )
    assert panel.update() is True
    assert isinstance(shown[0], list) and "step 1" in "".join(shown[0])
    plain = LiveView(
        agg,
        "plain",
        "train",
        lambda lines: False,
        lambda line: shown.append(line) or False,
        lambda: None,
        width=lambda: 60,
        color_system=None,
        wall=lambda: 10.0,
    )
    assert plain.update() is False  # not at a line start: the caller tries again soon
    assert isinstance(shown[1], str) and shown[1].startswith("trainmedic [0:00:10] step 1")


def _ddp(agg: LiveAggregate, waits: dict[int, float], n: int = 30) -> None:
    for k in range(1, n + 1):
        for rank, wait in waits.items():
            agg.add_step(make_step(k, pid=100 + rank, rank=rank, wait=wait, duration=0.05))


def test_each_rank_is_shown_and_a_straggler_warned_about() -> None:
    agg = LiveAggregate(100.0)
    _ddp(agg, {0: 0.001, 1: 0.04, 2: 0.002})
    status = agg.status(110.0)
    assert [r.rank for r in status.ranks] == [0, 1, 2]
    assert status.ranks[1].data_wait_share == pytest.approx(0.8)
    assert any(w.startswith("rank 1 straggles") for w in status.warnings)
    assert "r1 50ms wait 80%" in " ".join(render_panel(status, "job", 120, None))


def test_balanced_ranks_raise_no_straggler_warning() -> None:
    agg = LiveAggregate(100.0)
    _ddp(agg, {0: 0.01, 1: 0.012, 2: 0.011, 3: 0.009})
    status = agg.status(110.0)
    assert len(status.ranks) == 4
    assert not [w for w in status.warnings if "straggles" in w]
