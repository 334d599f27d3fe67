"""Whole-run statistics: warm-up, percentiles, shares, rates, windows, ranks, GPU and host."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support import builders
from trainmedic.gpu.types import GpuSample
from trainmedic.record.stats import (
    all_spans,
    split_steps,
    summarize,
    warmup_length,
    weighted_quantile,
)
from trainmedic.record.types import HostSample, RunRecord, StepRecord, StepWindow

T0 = builders.T0


def make_steps(durations: list[float], *, pid: int = 100, **kw: Any) -> list[StepRecord]:
    return builders.make_steps(len(durations), durations=durations, pid=pid, **kw)


def make_record(**parts: Any) -> RunRecord:
    # A run still open: no end time, so no wall time unless the test gives one.
    return builders.make_record(ended_at=None, **parts)


def make_host(
    t: float, *, job_cpu_pct: float = 150.0, usable: float = 8.0, others_pct: float | None = 20.0
) -> HostSample:
    return builders.make_host(
        t,
        job_cpu_pct=job_cpu_pct,
        usable_cores=usable,
        others_cpu_pct=others_pct,
        job_rss_bytes=2 << 30,
    )


def make_gpu(
    t: float,
    *,
    index: int = 0,
    util: float = 90.0,
    used: int = 10 << 30,
    pids: tuple[int, ...] = (),
) -> GpuSample:
    return builders.make_gpu(
        t, index=index, utilization_gpu_pct=util, memory_used_bytes=used, job_pids=pids
    )


def test_empty_record_gives_zero_counts_and_no_statistics() -> None:
    s = summarize(make_record())
    assert (s.steps_total, s.steps_steady, s.processes) == (0, 0, 0)
    assert s.step_time_median_s is None and s.steps_per_s is None
    assert s.data_wait_share is None and s.gpus == () and s.job_cpu_mean_cores is None
    assert s.wall_s is None
    json.dumps(s.to_dict())  # JSON-ready


def test_leading_slow_steps_are_warmup_and_excluded() -> None:
    steps = make_steps([5.0, 2.0] + [0.1] * 98, wait=0.02)
    s = summarize(make_record(steps=steps))
    assert s.steps_warmup == 2 and s.steps_steady == 98 and s.steps_train == 100
    assert s.step_time_median_s == pytest.approx(0.1)
    assert s.step_time_max_s == pytest.approx(0.1)
    assert s.steps_per_s == pytest.approx(10.0)
    assert s.data_wait_share == pytest.approx(0.2)
    assert s.steady_wall_s == pytest.approx(9.8)
    assert s.steady_start_t == pytest.approx(T0 + 7.0)


def test_warmup_is_bounded_to_a_small_share_of_the_run() -> None:
    # 40 steps: the cap is max(3, 10 % of 40) = 4, whatever the durations do.
    steps = make_steps([3.0] * 6 + [0.1] * 34)
    assert summarize(make_record(steps=steps)).steps_warmup == 4


def test_no_warmup_when_steps_are_even_from_the_start() -> None:
    s = summarize(make_record(steps=make_steps([0.1] * 50)))
    assert s.steps_warmup == 0 and s.steps_steady == 50


def test_step_at_settle_edge_is_kept() -> None:
    # 1.5 x median is settled; a hair above is warm-up.
    assert summarize(make_record(steps=make_steps([0.15] + [0.1] * 30))).steps_warmup == 0
    assert summarize(make_record(steps=make_steps([0.151] + [0.1] * 30))).steps_warmup == 1


def test_warmup_ends_at_a_settled_run_not_a_single_fast_step() -> None:
    # a compile, one ordinary step, a second compile (e.g. eval graph), then steady
    spans = all_spans(make_record(steps=make_steps([4.0, 0.1, 3.0] + [0.1] * 60)))
    assert warmup_length(spans) == 3


def test_single_step_is_never_warmup() -> None:
    s = summarize(make_record(steps=make_steps([9.0])))
    assert s.steps_warmup == 0 and s.steps_steady == 1
    assert s.step_time_median_s == pytest.approx(9.0)


def test_percentiles_of_exact_steps_match_linear_interpolation() -> None:
    durations = [0.1 * (i + 1) for i in range(10)]  # 0.1 .. 1.0, ascending: no warm-up
    s = summarize(make_record(steps=make_steps(durations)))
    assert s.steps_warmup == 0
    assert s.step_time_median_s == pytest.approx(0.55)
    assert s.step_time_p90_s == pytest.approx(0.91)
    assert s.step_time_p99_s == pytest.approx(0.991)


def test_weighted_quantile_equals_repeated_values() -> None:
    assert weighted_quantile([(1.0, 3), (2.0, 1)], 0.5) == pytest.approx(1.0)
    assert weighted_quantile([(1.0, 1), (2.0, 1)], 0.5) == pytest.approx(1.5)
    assert weighted_quantile([(5.0, 2), (1.0, 2)], 1.0) == pytest.approx(5.0)
    assert weighted_quantile([], 0.5) is None


def test_windows_count_as_folded_steps_at_their_mean() -> None:
    exact = make_steps([2.0, 0.2, 0.2, 0.2], wait=0.05, samples=32)
    window = StepWindow(
        t_start=exact[-1].t,
        t=exact[-1].t + 20.0,
        count=100,
        first_step=5,
        last_step=104,
        duration_sum_s=20.0,
        duration_min_s=0.19,
        duration_max_s=0.21,
        data_wait_sum_s=5.0,
        compute_sum_s=12.0,
        samples_sum=3200,
        pid=100,
    )
    s = summarize(make_record(steps=exact, windows=[window]))
    assert (s.steps_total, s.steps_exact, s.steps_folded) == (104, 4, 100)
    assert s.steps_warmup == 1 and s.steps_steady == 103
    assert s.step_time_median_s == pytest.approx(0.2)
    assert s.data_wait_share == pytest.approx((0.15 + 5.0) / 20.6)
    # compute is known only for the window: its share is over the window's time
    assert s.compute_share == pytest.approx(12.0 / 20.0)
    assert s.samples_per_step_mean == pytest.approx(32.0)
    assert s.samples_per_s == pytest.approx(32 * 103 / 20.6)


def test_ranks_run_side_by_side_rates_are_per_process_and_samples_add_up() -> None:
    r0 = make_steps([0.5] * 40, samples=16, pid=11, rank=0)
    r1 = make_steps([0.5] * 40, samples=16, pid=12, rank=1)
    s = summarize(make_record(steps=r0 + r1))
    assert (s.processes, s.ranks, s.steps_steady) == (2, 2, 80)
    assert s.steps_per_s == pytest.approx(2.0)
    assert s.steady_wall_s == pytest.approx(20.0)
    assert s.samples_per_s == pytest.approx(64.0)  # 2 ranks x 16 samples x 2 steps/s


def test_restarted_process_counts_its_own_warmup_and_no_gap() -> None:
    first = make_steps([3.0] + [0.1] * 29, pid=1)
    second = make_steps([3.0] + [0.1] * 29, pid=2, start=T0 + 100.0)
    s = summarize(make_record(steps=first + second))
    assert s.steps_warmup == 2 and s.steps_steady == 58
    assert s.steady_wall_s == pytest.approx(5.8)


def test_other_phases_are_counted_but_not_in_step_times() -> None:
    train = make_steps([0.1] * 30)
    evals = make_steps([1.0] * 5, phase="eval", first_step=31, start=train[-1].t)
    s = summarize(make_record(steps=train + evals))
    assert s.steps_by_phase == {"train": 30, "eval": 5}
    assert s.steps_train == 30 and s.step_time_max_s == pytest.approx(0.1)


def test_gpu_and_host_means_cover_the_steady_part() -> None:
    steps = make_steps([5.0] + [0.1] * 40, pid=7)  # steady from T0+5 to T0+9
    gpu = [make_gpu(T0 + 1.0, util=0.0, pids=(7,))]
    gpu += [make_gpu(T0 + 5.0 + i, util=80.0 + 5 * i, pids=(7,)) for i in range(4)]
    gpu += [make_gpu(T0 + 6.0, index=1, util=0.0, pids=(999,))]
    host = [make_host(T0 + 1.0, job_cpu_pct=800.0)]
    host += [make_host(T0 + 6.0, job_cpu_pct=100.0), make_host(T0 + 8.0, job_cpu_pct=300.0)]
    s = summarize(make_record(steps=steps, gpu=gpu, host=host))
    g0, g1 = s.gpus
    assert g0.samples == 4 and g0.utilization_mean_pct == pytest.approx(87.5)
    assert g0.used_by_job is True and g1.used_by_job is False
    assert s.gpu_utilization_mean_pct == pytest.approx(87.5)  # only the job's GPU
    assert s.job_cpu_mean_cores == pytest.approx(2.0)
    assert s.usable_cores == pytest.approx(8.0)
    assert s.others_cpu_mean_cores == pytest.approx(0.2)
    assert s.job_rss_max_bytes == 2 << 30


def test_gpu_share_and_cpu_only_run() -> None:
    s = summarize(make_record(steps=make_steps([0.2] * 20, compute=0.15, gpu_time=0.1)))
    assert s.gpu_time_share == pytest.approx(0.5) and s.compute_share == pytest.approx(0.75)
    assert s.gpus == () and s.gpu_utilization_mean_pct is None


def test_split_keeps_every_span_once() -> None:
    steps = make_steps([3.0] + [0.1] * 20) + make_steps(
        [1.0] * 3, phase="checkpoint", first_step=22
    )
    split = split_steps(all_spans(make_record(steps=steps)))
    assert len(split.warmup) + len(split.steady) + len(split.other_phases) == 24
    assert [s.phase for s in split.other_phases] == ["checkpoint"] * 3


def test_gpu_utilization_without_a_pid_match_skips_empty_gpus() -> None:
    steps = make_steps([0.1] * 40, pid=7)
    busy = [make_gpu(T0 + i, index=0, util=90.0, pids=(12345,)) for i in range(1, 4)]
    empty = [make_gpu(T0 + i, index=1, util=0.0, used=0) for i in range(1, 4)]
    s = summarize(make_record(steps=steps, gpu=busy + empty))
    assert [g.looks_unused for g in s.gpus] == [False, True]
    assert s.gpu_utilization_mean_pct == pytest.approx(90.0)
    only_empty = summarize(make_record(steps=steps, gpu=empty))
    assert only_empty.gpu_utilization_mean_pct == pytest.approx(0.0)


def test_a_window_of_steps_partly_without_compute_or_gpu_times_keeps_their_shares() -> None:
    """Short steps timed without the compute hooks (docs/run.md) have no compute
    time: a window folding them must not dilute the share over all its steps."""
    import dataclasses

    from trainmedic.record.codec import decode_window, encode_window
    from trainmedic.record.ranks import rank_stats
    from trainmedic.record.retention import WindowBuilder

    steps, windows, events = [], [], []
    for rank in (0, 1):
        pid = 100 + rank
        exact = make_steps([2.0, 0.2, 0.2, 0.2], wait=0.05, samples=32, compute=0.1,
                           gpu_time=0.15, pid=pid, rank=rank)  # fmt: skip
        later = [  # 4 of each 16 steps timed with the compute hooks
            s if (s.step - 5) % 16 < 4 else dataclasses.replace(s, compute_s=None)
            for s in make_steps([0.2] * 64, wait=0.05, samples=32, compute=0.1, pid=pid,
                                rank=rank, start=exact[-1].t, first_step=5, gpu_time=0.15)
        ]  # fmt: skip
        # Every eighth step's CUDA events were not ready when its record was made.
        later = [s if s.step % 8 else dataclasses.replace(s, gpu_time_s=None) for s in later]
        builder = WindowBuilder(later[0])
        for s in later:
            builder.add(s)
        window = decode_window(json.loads(json.dumps(encode_window(builder.build()))))
        assert (window.compute_count, window.compute_duration_sum_s) == (16, pytest.approx(3.2))
        assert (window.gpu_time_count, window.gpu_time_duration_sum_s) == (56, pytest.approx(11.2))
        steps += exact
        windows.append(window)
        events.append(builders.make_event("process_start", pid=pid, rank=rank, local_rank=rank))
    record = make_record(steps=steps, windows=windows, events=events)
    summary = summarize(record)
    assert summary.compute_share == pytest.approx(0.1 / 0.2)  # 0.125 if diluted
    assert summary.gpu_time_share == pytest.approx(0.15 / 0.2)  # 0.656 if diluted
    stats = rank_stats(record, split_steps(all_spans(record)))
    assert [r.compute_s for r in stats] == [pytest.approx(0.1)] * 2
    assert [r.gpu_time_s for r in stats] == [pytest.approx(0.15)] * 2
