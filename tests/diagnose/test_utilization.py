"""GPU idle without data wait: host overhead vs a small batch."""

from __future__ import annotations

import pytest

from support.builders import (
    GIB,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.utilization import host_overhead, small_batch
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Severity
from trainmedic.record.types import RunRecord

TH = Thresholds()


def idle_gpu_record(
    util: float = 30.0,
    *,
    samples: int | None = 256,
    used_gib: int = 50,
    wait: float = 0.005,
    gpu_time: float | None = None,
) -> RunRecord:
    return make_record(
        make_steps(100, 0.05, wait, samples=samples, compute=0.04, gpu_time=gpu_time),
        gpu=make_gpu_series(6, utilization_gpu_pct=util, memory_used_bytes=used_gib * GIB),
        host=make_host_series(6),
        loaders=[make_loader(8, batch_size=samples)],
    )


def both(record: RunRecord) -> list[str]:
    view = RunView.of(record)
    return [f.id for f in host_overhead(view, TH) + small_batch(view, TH)]


def test_idle_gpu_with_a_big_batch_is_host_overhead() -> None:
    (f,) = host_overhead(RunView.of(idle_gpu_record()), TH)
    assert f.category is Category.FRAMEWORK_CONFIG and f.severity is Severity.WARNING
    assert f.impact == pytest.approx(1 - 0.30 - 0.1)  # idle share not explained by data wait
    assert f.evidence["gpu_utilization_pct"] == 30.0
    assert f.evidence["host_compute_share"] == pytest.approx(0.8)
    assert "reduce-overhead" in f.fix and ".item()" in f.fix
    assert f.subject == "gpu0"


def test_idle_gpu_with_a_small_batch_and_free_memory_is_gpu_capacity() -> None:
    (f,) = small_batch(RunView.of(idle_gpu_record(samples=16, used_gib=8)), TH)
    assert f.id == "gpu.small_batch" and f.category is Category.GPU_CAPACITY
    assert f.evidence["samples_per_step"] == 16.0
    assert f.evidence["gpu_memory_used_share"] == pytest.approx(0.1)
    assert "batch_size=128" in f.fix and "learning rate" in f.fix  # x8 fills 80 %


def test_the_two_rules_never_fire_together() -> None:
    assert both(idle_gpu_record(samples=16, used_gib=8)) == ["gpu.small_batch"]
    assert both(idle_gpu_record(samples=16, used_gib=60)) == ["gpu.host_overhead"]
    assert both(idle_gpu_record(samples=256, used_gib=8)) == ["gpu.host_overhead"]


def test_small_batch_edges() -> None:
    # 32 samples and 30 % memory are still small; one more sample is not.
    assert both(idle_gpu_record(samples=32, used_gib=24)) == ["gpu.small_batch"]
    assert both(idle_gpu_record(samples=33, used_gib=24)) == ["gpu.host_overhead"]


def test_batch_size_from_the_loader_when_steps_do_not_count_samples() -> None:
    record = make_record(
        make_steps(100, 0.05),
        gpu=make_gpu_series(6, utilization_gpu_pct=20.0, memory_used_bytes=4 * GIB),
        loaders=[make_loader(8, batch_size=8)],
    )
    assert both(record) == ["gpu.small_batch"]


def test_busy_gpu_edge_is_quiet() -> None:
    assert both(idle_gpu_record(util=50.0)) == []
    assert both(idle_gpu_record(util=49.0)) == ["gpu.host_overhead"]


def test_data_wait_suppresses_both() -> None:
    # 20 % wait: the input rule owns the idle GPU
    assert both(idle_gpu_record(wait=0.01)) == []


def test_cuda_event_time_judges_when_nvml_is_absent() -> None:
    record = make_record(make_steps(100, 0.05, gpu_time=0.01, samples=256))
    (f,) = host_overhead(RunView.of(record), TH)
    assert f.evidence["gpu_busy_share"] == pytest.approx(0.2)


def test_cpu_only_run_on_a_gpu_machine_is_not_an_idle_gpu() -> None:
    # GPU readings list processes, none of them the job's, and the steps show no CUDA use
    record = make_record(
        make_steps(100, 0.05),
        gpu=make_gpu_series(6, utilization_gpu_pct=0.0, job_pids=(), memory_used_bytes=0),
    )
    assert RunView.of(record).uses_gpu is False
    assert both(record) == []


def test_unmatched_pids_judge_only_the_gpus_in_use() -> None:
    # eight GPUs, pids from another namespace: only GPU 3 holds memory and works
    gpu = []
    for index in range(8):
        if index == 3:
            gpu += make_gpu_series(6, index=3, job_pids=(), utilization_gpu_pct=97.0)
        else:
            gpu += make_gpu_series(
                6, index=index, job_pids=(), utilization_gpu_pct=0.0, memory_used_bytes=0
            )
    view = RunView.of(make_record(make_steps(100, 0.05, samples=256), gpu=gpu))
    assert view.job_gpu_indices == (3,)
    assert view.gpu_util_pct == 97.0
    assert both(make_record(make_steps(100, 0.05, samples=256), gpu=gpu)) == []


def test_idle_gpu_with_driver_reserved_memory_and_no_process_is_unused() -> None:
    idle = make_gpu_series(6, utilization_gpu_pct=0.0, job_pids=(), memory_used_bytes=600 << 20)
    assert RunView.of(make_record(make_steps(100, 0.05), gpu=idle)).uses_gpu is False
    # a process NVML shows under another namespace's pid, holding a CUDA context
    other_ns = make_gpu_series(
        6, utilization_gpu_pct=0.0, job_pids=(77,), memory_used_bytes=600 << 20
    )
    view = RunView.of(make_record(make_steps(100, 0.05, samples=256), gpu=other_ns))
    assert view.uses_gpu is None and view.job_gpu_indices == (0,)
    assert both(make_record(make_steps(100, 0.05, samples=256), gpu=other_ns)) == [
        "gpu.host_overhead"
    ]
