"""The NVML backend on a real NVIDIA GPU: readings within physical bounds.

Run by ``scripts/gpu-check`` (``pytest -m gpu``), which makes a missing GPU a
failure; elsewhere these tests skip (tests/conftest.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from support.real_gpu import nvml_backend_fixture
from trainmedic.doctor.checks import driver, inventory
from trainmedic.doctor.gather import DoctorRequest, gather_facts
from trainmedic.doctor.runner import run_checks
from trainmedic.gpu.backend import GpuBackend, sample_all
from trainmedic.gpu.types import ClockEventReason, GpuSample, normalize_pci_bus_id
from trainmedic.supervise.launch.stop import wait_gpu_release

pytestmark = pytest.mark.gpu


backend = nvml_backend_fixture()


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
        assert s.uuid is not None and s.uuid.startswith(("GPU-", "MIG-"))
        assert s.pci_bus_id is not None and len(s.pci_bus_id) == len("0000:3b:00.0")
        assert s.unreachable is None
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
        # PCIe: consistent readings, not a healthy link. The "max" values are the GPU's
        # and its slot's as the driver sees the slot: a VM's virtual root port may
        # report one below the link in use, and an idle link runs below it (doctor
        # judges that). Only the GPU's own maximum bounds the generation it runs at.
        p = s.pcie
        for gen in (p.gen_current, p.gen_max, p.gen_gpu_max):
            assert gen is None or 1 <= gen <= 7, p
        for width in (p.width_current, p.width_max):
            assert width is None or 1 <= width <= 32, p
        if p.gen_current is not None and p.gen_gpu_max is not None:
            assert p.gen_current <= p.gen_gpu_max, p
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


# --- the job's own process, and its memory released ------------------------------------------

HOLD_MIB = 512


def _holder() -> subprocess.Popen[str]:
    """A process holding HOLD_MIB of GPU memory until killed."""
    code = (
        "import sys, time, torch\n"
        f"x = torch.empty({HOLD_MIB} << 20, dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_own_process_is_listed_and_its_memory_release_is_waited_for(backend: GpuBackend) -> None:
    proc = _holder()
    try:
        deadline = time.monotonic() + 30
        listed: list[GpuSample] = []
        while time.monotonic() < deadline:
            listed = sample_all(backend)
            if any(p.pid == proc.pid for s in listed for p in s.processes):
                break
            time.sleep(0.5)
        for s in listed:
            assert s.known_processes is not None, s.processes_unreadable
        pids = {p.pid for s in listed for p in s.processes}
        if proc.pid not in pids:
            # In a container NVML names processes by the host's pids: then a process
            # holding our memory must still be listed, under a pid we cannot see.
            held = [p for s in listed for p in s.processes if p.user is None]
            assert held and any(
                (p.used_memory_bytes or 0) >= (HOLD_MIB - 64) << 20 for p in held
            ), f"pid {proc.pid} not in NVML's process lists {sorted(pids)}"
            pytest.skip("NVML lists the job under another pid namespace's pid")
        mine = next(p for s in listed for p in s.processes if p.pid == proc.pid)
        assert mine.used_memory_bytes is None or mine.used_memory_bytes >= HOLD_MIB << 20
    finally:
        proc.kill()
        proc.wait(30)

    def gpu_pids() -> set[int] | None:
        samples = sample_all(backend)
        if any(s.known_processes is None for s in samples):
            return None
        return {p.pid for s in samples for p in s.processes}

    released, waited = wait_gpu_release({proc.pid}, gpu_pids, 30.0)
    assert released is True, f"pid {proc.pid} still listed after {waited:.1f} s"


# --- NVML against nvidia-smi -------------------------------------------------------------------


def _smi(fields: list[str]) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    done = subprocess.run(
        [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in done.stdout.strip().splitlines()]


def test_nvml_readings_match_nvidia_smi(backend: GpuBackend) -> None:
    base = ["index", "pci.bus_id", "power.draw", "clocks.sm", "pcie.link.gen.current"]
    rows = None
    # Readings change from moment to moment: NVML is read just before and just after
    # nvidia-smi, and each of nvidia-smi's values must match one of the two.
    before = {s.index: s for s in sample_all(backend)}
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        rows = _smi([*base, reasons])
        if rows is not None:
            break
    after = {s.index: s for s in sample_all(backend)}
    if rows is None:
        pytest.skip("nvidia-smi is not available or does not know these fields")
    for index, bus, power, sm, gen, active in rows:
        i = int(index)
        pair = (before[i], after[i])
        assert before[i].pci_bus_id == normalize_pci_bus_id(bus)
        if power not in ("[N/A]", "[Not Supported]", "N/A"):
            watts = float(power)
            assert any(
                s.power_draw_w is not None
                and abs(s.power_draw_w - watts) <= max(25.0, 0.2 * watts)
                for s in pair
            ), (watts, [s.power_draw_w for s in pair])
        if sm not in ("[N/A]", "N/A"):
            mhz = float(sm)
            assert any(
                s.sm_clock_mhz is not None and abs(s.sm_clock_mhz - mhz) <= max(150.0, 0.2 * mhz)
                for s in pair
            ), (mhz, [s.sm_clock_mhz for s in pair])
        if gen not in ("[N/A]", "N/A"):
            assert any(s.pcie.gen_current is not None and abs(s.pcie.gen_current - int(gen)) <= 1
                       for s in pair)
        if active.startswith("0x"):
            # Bits that hold steadily (all but idle and the power cap, which flicker).
            steady = ~int(ClockEventReason.GPU_IDLE | ClockEventReason.SW_POWER_CAP)
            assert any(
                s.clock_event_reasons is not None
                and (s.clock_event_reasons & steady) == (int(active, 16) & steady)
                for s in pair
            ), (active, [hex(s.clock_event_reasons or 0) for s in pair])
