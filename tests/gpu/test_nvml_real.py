"""The NVML backend on a real NVIDIA GPU: readings within physical bounds.

Run with ``pytest -m gpu``; fails (does not skip) without a driver, since a
GPU check that silently passes on a machine without GPUs proves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainmedic.doctor.checks import driver, inventory
from trainmedic.doctor.gather import DoctorRequest, gather_facts
from trainmedic.doctor.runner import run_checks
from trainmedic.gpu.backend import GpuBackend, sample_all
from trainmedic.gpu.nvml import open_nvml
from trainmedic.gpu.types import GpuSample

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> Iterator[GpuBackend]:
    opened = open_nvml()
    assert opened.kind == "nvml", f"no NVML here: {opened.absent_reason}"
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def samples(backend: GpuBackend) -> list[GpuSample]:
    found = sample_all(backend)
    assert found, "the driver reports no GPU"
    return found


def test_driver_reports_version_and_cuda(backend: GpuBackend) -> None:
    info = backend.driver()
    assert info is not None
    assert info.version and info.version[0].isdigit()
    assert info.cuda_version is not None and info.cuda_version >= (11, 0)


def test_identity_and_memory(samples: list[GpuSample]) -> None:
    for s in samples:
        assert s.name and s.name != f"GPU {s.index}"
        assert s.uuid.startswith(("GPU-", "MIG-"))
        assert s.memory_total_bytes is not None and s.memory_total_bytes >= 1 << 30
        assert s.memory_used_bytes is not None
        assert 0 <= s.memory_used_bytes <= s.memory_total_bytes
        assert s.compute_capability is not None and s.compute_capability[0] >= 3


def test_readings_are_within_physical_bounds(samples: list[GpuSample]) -> None:
    for s in samples:
        if s.utilization_gpu_pct is not None:
            assert 0 <= s.utilization_gpu_pct <= 100
        if s.temperature_c is not None:
            assert 5 <= s.temperature_c <= 110
        if s.temperature_slowdown_c is not None:
            assert 60 <= s.temperature_slowdown_c <= 120
            if s.temperature_shutdown_c is not None:
                assert s.temperature_shutdown_c >= s.temperature_slowdown_c
        if s.power_limit_w is not None:
            assert 10 <= s.power_limit_w <= 2000
            if s.power_draw_w is not None:
                assert 0 < s.power_draw_w <= 1.5 * s.power_limit_w
        if s.sm_clock_max_mhz is not None:
            assert 300 <= s.sm_clock_max_mhz <= 4000
            if s.sm_clock_mhz is not None:
                assert 0 < s.sm_clock_mhz <= 1.05 * s.sm_clock_max_mhz
        p = s.pcie
        if p.width_current is not None and p.width_max is not None:
            assert 1 <= p.width_current <= p.width_max <= 32
        if p.gen_max is not None and p.gen_gpu_max is not None:
            assert 1 <= p.gen_max <= p.gen_gpu_max <= 7
        for process in s.processes:
            assert process.pid > 0


def test_doctor_reports_every_gpu(samples: list[GpuSample]) -> None:
    facts = gather_facts(DoctorRequest())
    assert facts.gpu.backend == "nvml"
    assert len(facts.gpu.samples) == len(samples)
    # On a machine with GPUs doctor imports torch for the architecture checks.
    assert facts.torch is not None and facts.torch.probed
    findings = run_checks(facts, [*inventory.CHECKS, *driver.CHECKS])
    subjects = {f.subject for f in findings if f.id == "inventory.gpu"}
    assert subjects == {f"gpu{s.index}" for s in samples}
