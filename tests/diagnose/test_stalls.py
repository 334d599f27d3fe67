"""Stalls: how many, when, what they cost, and where the time went."""

from __future__ import annotations

from dataclasses import replace

import pytest

from support.builders import (
    T0,
    during,
    make_activity,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
    make_window,
)
from trainmedic.diagnose.stalls import epoch_lengths, find_stalls, stalls
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import ClockEventReason as R
from trainmedic.record.types import RunRecord, StepRecord

TH = Thresholds()


def with_stalls(
    slow: dict[int, float],
    *,
    wait: float = 0.0,
    gpu_time: float | None = None,
    n: int = 300,
    base: float = 0.1,
) -> list[StepRecord]:
    """``n`` steps of ``base`` s; step i (1-based) takes ``slow[i]`` s, waiting ``wait``
    of it for data."""
    durations = [slow.get(i + 1, base) for i in range(n)]
    steps = make_steps(n, durations=durations)
    return [
        replace(
            s,
            data_wait_s=wait * s.duration_s,
            gpu_time_s=None if gpu_time is None else gpu_time * s.duration_s,
        )
        if s.step in slow
        else s
        for s in steps
    ]


def run(record: RunRecord) -> list[Finding]:
    return stalls(RunView.of(record), TH)


def test_host_side_stalls_with_count_steps_times_and_cost() -> None:
    steps = with_stalls({100: 3.0, 200: 2.0})
    (f,) = run(make_record(steps))
    assert f.id == "stall.framework_config" and f.category is Category.FRAMEWORK_CONFIG
    assert f.evidence["stalls"] == 2 and f.evidence["stall_steps"] == [100, 200]
    assert f.evidence["stall_at_s"] == pytest.approx([steps[99].t - T0, steps[199].t - T0])
    assert f.evidence["time_lost_s"] == pytest.approx(2.9 + 1.9)
    assert f.evidence["stall_longest_s"] == pytest.approx(3.0)
    total = 298 * 0.1 + 5.0
    assert f.impact == pytest.approx(4.8 / total)
    assert f.severity is Severity.WARNING  # 13.8 % of the time


def test_stall_edges_factor_and_floor() -> None:
    # median 0.1 s: 5x is 0.5 s, but the 1 s floor rules; exactly 1 s is not a stall
    assert find_stalls(RunView.of(make_record(with_stalls({50: 1.0}))), TH) == []
    assert len(find_stalls(RunView.of(make_record(with_stalls({50: 1.01}))), TH)) == 1
    # median 0.5 s: the factor rules (2.5 s)
    slow = make_record(with_stalls({50: 2.5, 60: 2.6}, base=0.5))
    assert [s.step for s in find_stalls(RunView.of(slow), TH)] == [60]


def test_small_stall_cost_is_information() -> None:
    (f,) = run(make_record(with_stalls({500: 1.5}, n=1000)))
    assert f.severity is Severity.INFO
    assert f.impact == pytest.approx(1.4 / (999 * 0.1 + 1.5))


def test_warmup_and_checkpoint_phases_are_not_stalls() -> None:
    steps = make_steps(300, durations=[20.0] + [0.1] * 299)
    ckpt = make_steps(2, 30.0, phase="checkpoint", first_step=301, start=steps[-1].t)
    assert run(make_record(steps + ckpt)) == []


def test_data_stall_cause_from_stacks_during_it() -> None:
    steps = with_stalls({150: 4.0}, wait=0.95)
    t_end = steps[149].t
    activity = [
        # a stall of 1 s and more is sampled every 20 ms: 50 samples and more
        make_activity(t=t_end, file_read=48, transform=3),
        make_activity(t=T0 + 5.0, transform=200),
    ]
    (f,) = run(make_record(steps, activity=activity))
    assert f.id == "stall.io" and f.evidence["stall_data_wait_share_mean"] == pytest.approx(0.95)


def test_data_stall_cause_from_the_sends_after_it_of_every_process() -> None:
    # Three processes send their samples every 2 s, within 10 ms of each other; the
    # stall ends between two sends, so its reads show only in each process's next send.
    # The gaps between all records are mostly 10 ms: the period must be per process.
    steps = with_stalls({150: 1.3}, wait=0.95)
    t_end = steps[149].t
    sends = [t_end - 1.5 + 2.0 * k for k in range(-4, 4)]
    after = t_end + 0.5  # the first send after the stall
    activity = [
        make_activity(t=t + 0.01 * i, pid=pid, transform=3)
        for t in sends
        if t != after
        for i, pid in enumerate((700, 701, 702))
    ]
    activity += [
        make_activity(t=after, pid=700, file_read=40, idle=2),
        make_activity(t=after + 0.01, pid=701, idle=6),
        make_activity(t=after + 0.02, pid=702, ipc_wait=30),
    ]
    (f,) = run(make_record(steps, activity=activity))
    assert f.id == "stall.io"
    # The same reads sent before the stall began are not its evidence.
    moved = (after, after + 0.01, after + 0.02)
    before = [replace(a, t=a.t - 2.0) if a.t in moved else a for a in activity]
    assert run(make_record(steps, activity=before))[0].id == "stall.cpu"


def test_data_stall_cause_from_host_readings_then_overall_stacks() -> None:
    steps = with_stalls({150: 4.0}, wait=0.95)
    t_end = steps[149].t
    host = during(
        make_host_series(40), t_end - 1.0, t_end + 1.0, net_recv_bytes_per_s=300.0 * (1 << 20)
    )
    assert run(make_record(steps, host=host))[0].id == "stall.network"
    overall = [make_activity(t=T0 + 1.0, transform=100)]
    assert run(make_record(steps, activity=overall))[0].id == "stall.cpu"
    assert run(make_record(steps))[0].id == "stall.io"  # nothing else known


def test_gpu_side_stall_is_thermal_when_throttled_meanwhile() -> None:
    steps = with_stalls({150: 4.0}, gpu_time=0.9)
    t_end = steps[149].t
    series = make_gpu_series(40)
    hot = during(series, t_end - 2.0, t_end + 1.0, clock_event_reasons=int(R.HW_THERMAL_SLOWDOWN))
    assert run(make_record(steps, gpu=hot))[0].id == "stall.thermal"
    assert run(make_record(steps, gpu=series))[0].id == "stall.gpu_capacity"


def test_host_side_stall_with_others_busy_is_contention() -> None:
    steps = with_stalls({150: 4.0}, gpu_time=0.05)
    t_end = steps[149].t
    host = during(make_host_series(40), t_end - 2.0, t_end + 1.0, others_cpu_pct=1200.0)
    (f,) = run(make_record(steps, host=host))
    assert f.id == "stall.contention"


def test_stalls_of_different_causes_are_separate_findings() -> None:
    steps = with_stalls({100: 3.0}, wait=0.9)
    steps[199] = replace(steps[199], duration_s=3.0)
    assert sorted(f.id for f in run(make_record(steps))) == ["stall.framework_config", "stall.io"]


def test_a_window_with_a_long_step_counts_one_stall() -> None:
    exact = make_steps(50)
    window = make_window(exact, 200, 0.1, duration_max=5.0)
    (f,) = run(make_record(exact, windows=[window]))
    assert f.evidence["stalls"] == 1 and f.evidence["stall_steps"] == [51]


def test_one_short_stall_is_information_however_short_the_run() -> None:
    (f,) = run(make_record(with_stalls({50: 3.0}, n=100)))
    assert f.impact is not None and f.impact > 0.2
    assert f.severity is Severity.INFO


def test_one_long_stall_is_a_warning() -> None:
    (f,) = run(make_record(with_stalls({50: 10.0}, n=100)))
    assert f.severity is Severity.WARNING and f.evidence["stall_longest_s"] == 10.0


def test_data_stalls_at_epoch_starts_with_workers_restarting() -> None:
    # 6400 samples / batch 64 = 100 steps per epoch: epochs start at steps 101 and 201
    steps = with_stalls({101: 3.0, 201: 3.0}, wait=0.95)
    restarting = make_loader(4, batch_size=64, dataset_len=6400)
    restarting = replace(restarting, persistent_workers=False)
    (f,) = run(make_record(steps, loaders=[restarting]))
    assert f.id == "stall.epoch_start" and f.category is Category.FRAMEWORK_CONFIG
    assert "persistent_workers=True" in f.fix
    persistent = make_loader(4, batch_size=64, dataset_len=6400)
    assert run(make_record(steps, loaders=[persistent]))[0].id == "stall.io"


def test_epoch_lengths_round_both_ways_and_split_across_ranks() -> None:
    loader = replace(make_loader(4, batch_size=64, dataset_len=6450), persistent_workers=False)
    view = RunView.of(make_record(make_steps(20), loaders=[loader]))
    assert epoch_lengths(view) == {100, 101}
    ranks = make_steps(20, pid=1) + make_steps(20, pid=2)
    two = RunView.of(make_record(ranks, loaders=[replace(loader, pid=1)]))
    assert epoch_lengths(two) == {50, 51}


def test_host_side_stall_titles_speak_of_a_gpu_only_when_there_is_one() -> None:
    steps = with_stalls({100: 3.0, 200: 2.0})
    (cpu_only,) = run(make_record(steps))  # no GPU readings: a CPU-only run
    assert "GPU" not in cpu_only.title and "(no data wait)" in cpu_only.title
    (gpu,) = run(make_record(steps, gpu=make_gpu_series(40, utilization_gpu_pct=60.0)))
    assert "GPU idle" in gpu.title


def test_a_stall_is_contention_only_when_the_thread_waited_through_it() -> None:
    # Stalls at steps 100 and 200 (3 s, 2 s) while others keep the machine busy.
    steps = with_stalls({100: 3.0, 200: 2.0})
    busy = {"others_cpu_pct": 1200.0, "train_threads": 1, "job_threads": 4}
    slept = make_host_series(40, train_wait_max_share=0.05, **busy)  # a save sleeping on disk
    (f,) = run(make_record(steps, host=slept))
    assert f.id == "stall.framework_config"
    starved = make_host_series(40, train_wait_max_share=0.8, **busy)  # runnable, no CPU
    (f,) = run(make_record(steps, host=starved))
    assert f.id == "stall.contention"
