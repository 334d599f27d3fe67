"""Why the GPU idles in each step, from trace summaries (trainmedic.diagnose.trace_rules):
hand-built steps for each cause and the variant built to fool it, and the real traces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainmedic.demo.traces import DEMO_TRACE
from trainmedic.diagnose.trace_rules import diagnose_trace
from trainmedic.findings.model import Category, Severity
from trainmedic.traces.kineto import Device, SyncSite, TraceStep, TraceSummary, read_trace

TRACES = Path(__file__).resolve().parents[1] / "traces" / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "gpu-traces"
STEP_US = 10_000.0


def steps(n: int = 5, **kw: float) -> tuple[TraceStep, ...]:
    """``n`` steps of 10 ms, busy 95 % unless told, with ``kw`` for every step."""
    base = {"gpu_busy_us": 0.95 * STEP_US, "kernels": 50, "kernel_us": 0.95 * STEP_US,
            "launches": 50, "launch_us": 250.0}  # fmt: skip
    base.update(kw)
    return tuple(
        TraceStep(number=i, start_us=i * STEP_US, dur_us=STEP_US, **base)  # type: ignore[arg-type]
        for i in range(n)
    )


def summary(s: tuple[TraceStep, ...], **kw: object) -> TraceSummary:
    return TraceSummary("t.json", 1000, s, Device(0, "NVIDIA A100", "8.0"), **kw)  # type: ignore[arg-type]


def ids(t: TraceSummary) -> list[str]:
    return [f.id for f in diagnose_trace(t)]


def test_a_busy_gpu_is_gpu_bound_information_and_nothing_about_the_host() -> None:
    (f,) = diagnose_trace(summary(steps()))
    assert (f.id, f.severity, f.category) == ("gpu.bound", Severity.INFO, Category.MODEL)
    assert f.evidence["gpu_busy_share"] == pytest.approx(0.95)


def test_synchronising_every_step_is_named_with_the_gpu_time_it_loses() -> None:
    site = SyncSite("train.py(30): train_step", "Tensor.item", "cudaStreamSynchronize", 10,
                    host_us=15_000, gpu_idle_us=15_000)  # fmt: skip
    each = steps(gpu_busy_us=6000, kernel_us=6000, syncs=2, sync_us=3000,
                 gpu_idle_after_sync_us=3000)  # fmt: skip
    t = summary(each, sync_sites=(site,), with_stack=True)
    (f, *rest) = diagnose_trace(t)
    assert f.id == "gpu.host_sync" and f.severity is Severity.ERROR  # 30 % of the step
    assert f.impact == pytest.approx(0.3) and f.evidence["syncs_per_step"] == 2
    assert "Tensor.item in train.py(30): train_step" in f.title
    assert f.evidence["sync_sites"] == [  # type: ignore[comparison-overlap]
        {"where": "train.py(30): train_step", "call": "Tensor.item",
         "runtime": "cudaStreamSynchronize", "count": 10, "host_ms": 15.0, "gpu_idle_ms": 15.0}
    ]  # fmt: skip
    assert ".item() when you log" in f.fix and "with_stack" not in f.fix
    assert "gpu.bound" not in [r.id for r in rest]
    # Without call sites: the general fix, and how to get them.
    bare = diagnose_trace(summary(steps(gpu_busy_us=6000, kernel_us=6000, syncs=2,
                                        sync_us=3000, gpu_idle_after_sync_us=3000)))  # fmt: skip
    assert "non_blocking=True" in bare[0].fix and "with_stack=True" in bare[0].fix


def test_a_gpu_bound_step_that_reads_its_loss_once_loses_nothing_to_it() -> None:
    # The host blocks 80 % of the step in .item() - waiting for a GPU that works all that
    # time - and the GPU idles 100 µs after it: the sync costs 1 %, the GPU is the limit.
    t = summary(steps(syncs=1, sync_us=8000, gpu_idle_after_sync_us=100))
    assert ids(t) == ["gpu.bound"]


def test_a_rare_short_sync_is_not_a_finding() -> None:
    # One cudaMemcpy of 30 µs a step (0.3 %): reading a scalar at the end of a step is fine.
    assert ids(summary(steps(syncs=1, sync_us=30, gpu_idle_after_sync_us=30))) == ["gpu.bound"]
    # A sync in one step of five (a checkpoint, a log every N steps) does not decide.
    s = list(steps())
    s[2] = dataclasses.replace(s[2], syncs=1, sync_us=5000, gpu_idle_after_sync_us=5000)
    assert ids(summary(tuple(s))) == ["gpu.bound"]


def test_many_short_kernels_with_the_gpu_idle_are_launch_bound() -> None:
    t = summary(steps(gpu_busy_us=3000, kernels=1500, kernel_us=3000, launches=1500,
                      launch_us=7500))  # fmt: skip
    f = next(f for f in diagnose_trace(t) if f.id == "gpu.launch_bound")
    assert f.evidence["mean_kernel_us"] == pytest.approx(2.0)
    assert f.evidence["host_us_per_launch"] == pytest.approx(5.0)
    assert f.impact == pytest.approx(0.7) and "reduce-overhead" in f.fix


def test_an_idle_gpu_with_long_kernels_is_not_launch_bound() -> None:
    # Same idle share, but 60 kernels of 50 µs: the launches are not the limit.
    t = summary(steps(gpu_busy_us=3000, kernels=60, kernel_us=3000, launches=60))
    found = ids(t)
    assert "gpu.launch_bound" not in found and "gpu.idle_unexplained" in found
    idle = next(f for f in diagnose_trace(t) if f.id == "gpu.idle_unexplained")
    assert idle.severity is Severity.INFO and "with_stack=True" in idle.fix


def test_pageable_copies_taking_a_share_of_the_step() -> None:
    t = summary(steps(pageable_copies=4, pageable_copy_us=800))
    f = next(f for f in diagnose_trace(t) if f.id == "gpu.pageable_copies")
    assert f.impact == pytest.approx(0.08) and "pin_memory=True" in f.fix
    # A few tiny ones (a scalar copied back) are not worth pinning.
    assert "gpu.pageable_copies" not in ids(summary(steps(pageable_copies=2, pageable_copy_us=20)))


def test_communication_nothing_overlaps_is_exposed_and_overlapped_is_not() -> None:
    exposed = summary(steps(nccl_us=4000, exposed_nccl_us=3500), rank=3, world_size=8)
    f = next(f for f in diagnose_trace(exposed) if f.id == "gpu.exposed_communication")
    assert f.severity is Severity.ERROR and f.evidence["rank"] == 3 and "no_sync()" in f.fix
    assert f.subject == "gpu0 rank 3"
    hidden = summary(steps(nccl_us=4000, exposed_nccl_us=200), rank=3, world_size=8)
    assert ids(hidden) == ["gpu.bound"]


def test_the_driver_called_for_memory_each_step_is_allocator_churn() -> None:
    t = summary(steps(allocs=3, alloc_us=400, frees=2, free_us=300))
    f = next(f for f in diagnose_trace(t) if f.id == "gpu.allocator_churn")
    assert (f.category, f.severity) == (Category.GPU_MEMORY, Severity.WARNING)
    assert f.impact == pytest.approx(0.07) and f.evidence["driver_allocs_per_step"] == 3
    assert "expandable_segments:True" in f.fix
    # The cache warming up in the first step, then serving every step: no finding.
    warm = list(steps())
    warm[0] = dataclasses.replace(warm[0], allocs=40, alloc_us=4000)
    assert ids(summary(tuple(warm))) == ["gpu.bound"]


def test_a_cache_holding_far_more_than_it_hands_out_is_fragmented() -> None:
    gib = 1 << 30
    device = Device(0, "NVIDIA A100", "8.0", 40 * gib)
    t = TraceSummary("t.json", 1, steps(), device, peak_reserved_bytes=38 * gib,
                     peak_allocated_bytes=20 * gib)  # fmt: skip
    (f,) = diagnose_trace(t)
    assert (f.id, f.severity) == ("gpu.memory_fragmented", Severity.WARNING)
    assert f.evidence["reserved_over_allocated"] == pytest.approx(1.9)
    roomy = dataclasses.replace(t, peak_reserved_bytes=30 * gib)
    assert diagnose_trace(roomy)[0].severity is Severity.INFO
    # 600 MiB of slack on a small model: no finding.
    small = dataclasses.replace(t, peak_reserved_bytes=gib, peak_allocated_bytes=gib // 3)
    assert ids(small) == ["gpu.bound"]


def test_a_loop_waiting_for_batches_while_the_gpu_idles() -> None:
    t = summary(steps(gpu_busy_us=5000, kernel_us=5000, data_us=4500))
    (f,) = diagnose_trace(t)
    assert (f.id, f.severity) == ("gpu.waits_for_data", Severity.ERROR)
    assert f.impact == pytest.approx(0.45) and "trainmedic run" in f.fix
    # A fast loader's few microseconds a step are nothing.
    assert ids(summary(steps(data_us=70))) == ["gpu.bound"]


def trace(name: str) -> TraceSummary:
    if name == DEMO_TRACE.name:
        return read_trace(DEMO_TRACE)
    path = TRACES / name if (TRACES / name).exists() else SHARED / name
    if not path.exists():
        pytest.skip(f"{name}: the shared GPU traces are not beside this checkout")
    return read_trace(path)


def test_the_real_traces() -> None:
    # A DDP job on 128 ranks: 45 % busy, NCCL alone 27 % of the step; more idle that the
    # GPU side does not explain.
    sampled = diagnose_trace(trace("sampled-rank0.json.gz"))
    assert [f.id for f in sampled] == ["gpu.exposed_communication", "gpu.idle_unexplained"]
    assert sampled[0].impact == pytest.approx(0.27, abs=0.01)


def test_the_shared_traces() -> None:
    # V100 DDP rank 0: busy 99 % of its steps - GPU-bound, nothing about the host.
    assert ids(trace("v100-ddp-rank0.json.gz")) == ["gpu.bound"]
    # A100, 8 ranks: busy 85 %, NCCL alone about 19 % of the step.
    control = diagnose_trace(trace("a100-control.json.gz"))
    assert [f.id for f in control] == ["gpu.exposed_communication"]
    assert control[0].severity is Severity.WARNING
