"""Canonical run records: the situations the golden findings documents pin down."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from support.builders import (
    GIB,
    JOB_PID,
    T0,
    during,
    make_activity,
    make_gpu_series,
    make_handoff,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.gpu.types import ClockEventReason, GpuProcess
from trainmedic.record.types import RunRecord


def healthy_gpu() -> RunRecord:
    """bf16 training on an A100, GPU busy 96 %, 2 % data wait, one compile step."""
    steps = make_steps(
        500,
        0.2,
        0.004,
        durations=[9.0] + [0.2] * 499,
        samples=128,
        autocast=True,
        compute=0.05,
        reserved_peak_bytes=50 * GIB,
    )
    return make_record(
        steps,
        gpu=make_gpu_series(
            110,
            name="NVIDIA A100-SXM4-80GB",
            utilization_gpu_pct=96.0,
            memory_used_bytes=52 * GIB,
            compute_capability=(8, 0),
        ),
        host=make_host_series(110, job_cpu_pct=450.0),
        loaders=[make_loader(8, batch_size=128)],
        activity=[make_activity(t=T0 + 50.0, transform=40, idle=400, ipc_wait=20)],
    )


def healthy_cpu() -> RunRecord:
    """CPU-only training using its 16 cores, 1 % data wait, no GPU readings."""
    return make_record(
        make_steps(300, 0.5, 0.005, samples=32),
        host=make_host_series(160, job_cpu_pct=1550.0, system_cpu_pct=98.0),
        loaders=[make_loader(2, batch_size=32)],
    )


def input_no_workers() -> RunRecord:
    """num_workers=0 on 16 idle cores: the GPU waits 60 % of each step."""
    return make_record(
        make_steps(400, 0.25, 0.15, samples=64, durations=[5.0] + [0.25] * 399),
        gpu=make_gpu_series(110, utilization_gpu_pct=38.0, memory_used_bytes=20 * GIB),
        host=make_host_series(110, job_cpu_pct=110.0),
        loaders=[make_loader(0, batch_size=64, pin_memory=False, prefetch_factor=None)],
        activity=[make_activity(t=T0 + 60.0, pid=4242, file_read=30, transform=60)],
    )


def input_slow_storage() -> RunRecord:
    """8 workers blocked reading files from slow storage, with two long read stalls."""
    durations = [0.4] * 300
    durations[120] = 6.0
    durations[240] = 4.0
    steps = make_steps(300, durations=durations, wait=0.25, samples=64)
    # the stalls are reads: all but the 0.15 s of compute is waiting
    steps = [replace(s, data_wait_s=s.duration_s - 0.15) for s in steps]
    return make_record(
        steps,
        gpu=make_gpu_series(140, utilization_gpu_pct=30.0, memory_used_bytes=20 * GIB),
        host=make_host_series(140, job_cpu_pct=250.0, iowait_pct=35.0),
        loaders=[make_loader(8, batch_size=64)],
        activity=[make_activity(t=T0 + 60.0, file_read=240, transform=30, ipc_wait=50)],
    )


def hot_shared_gpu() -> RunRecord:
    """GPU-bound fp32 training on an H100 that overheats, with a stranger's process on it."""
    stranger = GpuProcess(pid=31337, used_memory_bytes=6 * GIB, user="bob", name="python3")
    series = make_gpu_series(130, utilization_gpu_pct=97.0)
    series = during(series, T0 + 40.0, T0 + 80.0, processes=(*series[0].processes, stranger))
    series = during(
        series,
        T0 + 60.0,
        T0 + 90.0,
        temperature_c=88.0,
        sm_clock_mhz=1400.0,
        clock_event_reasons=int(ClockEventReason.HW_THERMAL_SLOWDOWN),
    )
    durations = [0.1] * 600 + [0.16] * 300 + [0.1] * 300
    return make_record(
        make_steps(1200, durations=durations, wait=0.001, autocast=False, samples=64),
        gpu=series,
        host=make_host_series(130),
        loaders=[make_loader(8, batch_size=64)],
    )


def handoff_pool_network() -> RunRecord:
    """No DataLoader: each batch from a pool of 4 threads fetching from a store that answers
    after ~30 ms; the training thread only waits on the futures (84 % of each step)."""
    return make_record(
        make_steps(100, 0.146, 0.122, samples=16),
        host=make_host_series(16, usable_cores=2.0, job_cpu_pct=33.0, others_cpu_pct=2.0),
        activity=[
            make_handoff(
                waits=84,
                threads={"socket": 330, "idle": 6},
                frames={"python3.11/socket.py:706 readinto < train.py:54 get": 330},
            )
        ],
    )


def short_run_unsettled() -> RunRecord:
    """300 steps of 0.2 ms, 60 % of it outside forward/backward, 6 stack samples there."""
    return make_record(
        make_steps(300, 0.0002, 0.00012, samples=32),
        host=make_host_series(2, usable_cores=2.0, job_cpu_pct=100.0),
        activity=[make_activity(pid=JOB_PID, transform=2, python=4)],
    )


CANONICAL: dict[str, Callable[[], RunRecord]] = {
    "healthy_gpu": healthy_gpu,
    "healthy_cpu": healthy_cpu,
    "input_no_workers": input_no_workers,
    "input_slow_storage": input_slow_storage,
    "hot_shared_gpu": hot_shared_gpu,
    "handoff_pool_network": handoff_pool_network,
    "short_run_unsettled": short_run_unsettled,
}
