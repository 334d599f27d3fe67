"""Small builders of doctor facts, healthy by default; override what a test is about.

Shared by every doctor check test:

    facts = make_facts(gpus=[make_gpu_sample(temperature_c=88.0)])
    facts = make_facts(host=make_host_facts(user="bob"), torch=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.findings.model import Finding
from trainmedic.framework.torch_build import TorchBuild
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuSample,
    PcieLink,
    RemappedRows,
)
from trainmedic.host.netprobe import NetworkMeasurement
from trainmedic.host.storage import StorageMeasurement
from trainmedic.host.types import CpuFacts, HostFacts, MemoryFacts, ShmFacts

GIB = 1 << 30
USER = "alice"
"""The user running doctor in :func:`make_host_facts`."""

_DEFAULT: Any = object()


def make_gpu_sample(**overrides: Any) -> GpuSample:
    """An idle, cool, healthy H100 80GB; keyword arguments replace fields."""
    sample = GpuSample(
        timestamp=1_700_000_000.0,
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-00000000-0000-0000-0000-000000000000",
        memory_total_bytes=81559 * (1 << 20),
        memory_used_bytes=512 * (1 << 20),
        utilization_gpu_pct=0.0,
        utilization_memory_pct=0.0,
        temperature_c=34.0,
        temperature_slowdown_c=87.0,
        temperature_shutdown_c=92.0,
        power_draw_w=72.0,
        power_limit_w=700.0,
        sm_clock_mhz=345.0,
        sm_clock_max_mhz=1980.0,
        clock_event_reasons=int(ClockEventReason.GPU_IDLE),
        ecc=EccCounts(0, 0, 0, 0),
        retired_pages_pending=False,
        remapped_rows=RemappedRows(0, 0, False, False),
        # Idle GPUs drop their link to Gen1 to save power: healthy.
        pcie=PcieLink(
            gen_current=1,
            gen_max=5,
            gen_gpu_max=5,
            width_current=16,
            width_max=16,
            tx_kib_per_s=0,
            rx_kib_per_s=0,
        ),
        processes=(),
        persistence_mode=True,
        compute_capability=(9, 0),
    )
    return replace(sample, **overrides)


def make_loaded_gpu_sample(**overrides: Any) -> GpuSample:
    """A healthy H100 busy with the user's own training process."""
    loaded: dict[str, Any] = {
        "utilization_gpu_pct": 98.0,
        "utilization_memory_pct": 60.0,
        "memory_used_bytes": 60 * GIB,
        "temperature_c": 68.0,
        "power_draw_w": 640.0,
        "sm_clock_mhz": 1980.0,
        "clock_event_reasons": 0,
        "pcie": PcieLink(5, 5, 5, 16, 16, 1000, 1000),
        "processes": (make_process(pid=4242, user=USER, used_memory_bytes=60 * GIB),),
    }
    loaded.update(overrides)
    return make_gpu_sample(**loaded)


def make_process(**overrides: Any) -> GpuProcess:
    """A python process of the user holding 10 GiB."""
    fields: dict[str, Any] = {
        "pid": 4242,
        "used_memory_bytes": 10 * GIB,
        "user": USER,
        "name": "python",
    }
    fields.update(overrides)
    return GpuProcess(**fields)


def make_host_facts(**overrides: Any) -> HostFacts:
    """A healthy, otherwise idle 32-core host with 256 GiB RAM; fields replaced by kwargs."""
    host = HostFacts(
        hostname="gpu-node-1",
        user=USER,
        cpu=CpuFacts(
            logical_cores=32,
            affinity_cores=32,
            cgroup_quota_cores=None,
            throttled_periods=None,
            total_periods=None,
            throttled_s=None,
            load_avg_1m=1.0,
            busy_pct=5.0,
            others_busy_cores=0.0,
        ),
        memory=MemoryFacts(
            total_bytes=256 * GIB,
            available_bytes=230 * GIB,
            swap_total_bytes=0,
            swap_used_bytes=0,
            others_rss_bytes=0,
        ),
        shm=ShmFacts(path="/dev/shm", total_bytes=128 * GIB, free_bytes=128 * GIB),
        env={},
        top_processes=(),
    )
    return replace(host, **overrides)


def make_torch_build(**overrides: Any) -> TorchBuild:
    """torch 2.4 for CUDA 12.4, imported (``probed``), CUDA and cuDNN working."""
    build = TorchBuild(
        version="2.4.0+cu124",
        cuda_version=(12, 4),
        arch_list=("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"),
        cudnn_version=90100,
        cudnn_available=True,
        cuda_available=True,
        probed=True,
    )
    return replace(build, **overrides)


def make_driver(**overrides: Any) -> DriverInfo:
    """Driver 550.54.15, which supports CUDA 12.4."""
    return replace(DriverInfo(version="550.54.15", cuda_version=(12, 4)), **overrides)


def make_facts(
    gpus: Sequence[GpuSample] | None = None,
    *,
    driver: DriverInfo | None = _DEFAULT,
    torch: TorchBuild | None = _DEFAULT,
    host: HostFacts | None = None,
    absent_reason: str | None = None,
    backend: str = "simulated",
    storage: StorageMeasurement | None = None,
    network: NetworkMeasurement | None = None,
) -> MachineFacts:
    """Facts of a healthy machine: one idle H100 unless ``gpus`` says otherwise.

    GPU indices are renumbered 0, 1, ... in the order given. ``driver=None``
    with ``gpus=[]`` is a machine without an NVIDIA driver.
    """
    samples = [make_gpu_sample()] if gpus is None else list(gpus)
    samples = [replace(s, index=i) for i, s in enumerate(samples)]
    return MachineFacts(
        host=host if host is not None else make_host_facts(),
        gpu=GpuFacts(
            backend=backend,
            driver=make_driver() if driver is _DEFAULT else driver,
            samples=tuple(samples),
            absent_reason=absent_reason,
        ),
        torch=make_torch_build() if torch is _DEFAULT else torch,
        storage=storage,
        network=network,
    )


def finding_keys(findings: Sequence[Finding]) -> set[tuple[str, str, str | None]]:
    """``{(id, severity, subject)}``: what a test asserts a check found, and nothing else."""
    return {(f.id, f.severity.value, f.subject) for f in findings}


def make_cpu_facts(**overrides: Any) -> CpuFacts:
    """The healthy CPU of :func:`make_host_facts`; keyword arguments replace fields."""
    return replace(make_host_facts().cpu, **overrides)


def make_memory_facts(**overrides: Any) -> MemoryFacts:
    """The healthy memory of :func:`make_host_facts`; keyword arguments replace fields."""
    return replace(make_host_facts().memory, **overrides)
