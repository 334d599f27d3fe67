"""The NVML backend against a stand-in ``pynvml`` answering as real drivers do.

The stand-in (``standin_nvml``) uses nvidia-ml-py's own error classes; its
values are chosen so a mixed-up constant or unit shows: the slowdown and
shutdown thresholds differ, power is in milliwatts, the CUDA version is
NVML's integer, the PCI bus id has NVML's 8-digit domain.
"""

from __future__ import annotations

import getpass
import os
import sys

import pytest
from standin_nvml import GIB, NOT_AVAILABLE, build, h100, state

from trainmedic.gpu.backend import NoGpuBackend, sample_all
from trainmedic.gpu.nvml import NvmlBackend, open_nvml
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    MigDevice,
    PcieLink,
    RemappedRows,
)

GHOST_PID = 4_000_000  # a plausible host pid that no process here has


def backend_for(*devices: dict, **driver: object) -> NvmlBackend:
    return NvmlBackend(build(state(*devices, **driver)))


def test_every_reading_is_converted_to_sample_units() -> None:
    backend = backend_for(h100())
    assert backend.kind == "nvml"
    assert backend.absent_reason is None
    assert backend.device_count() == 1
    s = backend.sample(0)
    assert s.index == 0
    assert s.name == "NVIDIA H100 80GB HBM3"
    assert s.uuid == "GPU-5f1c2d3e-0000-1111-2222-333344445555"
    assert s.pci_bus_id == "0000:3b:00.0"  # NVML's 00000000:3B:00.0, normalised
    assert (s.memory_total_bytes, s.memory_used_bytes) == (80 * GIB, 2 * GIB)
    assert (s.utilization_gpu_pct, s.utilization_memory_pct) == (87.0, 41.0)
    assert (s.temperature_c, s.temperature_slowdown_c, s.temperature_shutdown_c) == (
        71.0,
        88.0,
        93.0,
    )
    assert (s.power_draw_w, s.power_limit_w) == (312.5, 700.0)
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz) == (1275.0, 1980.0)
    assert s.reasons == ClockEventReason.SW_POWER_CAP
    assert s.ecc == EccCounts(
        volatile_corrected=4,
        volatile_uncorrected=1,
        aggregate_corrected=120,
        aggregate_uncorrected=2,
    )
    assert s.retired_pages_pending is False
    assert s.remapped_rows == RemappedRows(
        correctable=3, uncorrectable=1, pending=True, failure=False
    )
    assert s.pcie == PcieLink(5, 5, 5, 16, 16, 1200, 3400)
    assert s.persistence_mode is True
    assert s.compute_capability == (9, 0)
    assert s.mig_mode is None  # the stand-in GPU has no MIG: NotSupported
    assert s.processes_unreadable is None and s.known_processes == ()
    assert s.unreachable is None


def test_processes_resolve_owner_and_hidden_memory() -> None:
    gpu = h100(processes=[[os.getpid(), GIB], [GHOST_PID, NOT_AVAILABLE]])
    s = backend_for(gpu).sample(0)
    mine, ghost = s.processes
    assert mine == GpuProcess(
        pid=os.getpid(), used_memory_bytes=GIB, user=getpass.getuser(), name=mine.name
    )
    assert mine.name  # this test's own interpreter
    # A pid this namespace cannot see, with memory NVML hides.
    assert ghost == GpuProcess(pid=GHOST_PID, used_memory_bytes=None, user=None, name=None)


def test_not_supported_readings_become_none_and_no_identity_is_made_up() -> None:
    names = [n for n in dir(build(state(h100()))) if n.startswith("nvmlDeviceGet")]
    gpu = h100(errors={n: "NotSupported" for n in names if n != "nvmlDeviceGetHandleByIndex"})
    s = backend_for(gpu).sample(0)
    assert s.name == "GPU 0"
    assert s.uuid is None and s.pci_bus_id is None  # never "GPU-0"
    assert s.memory_total_bytes is None and s.memory_free_bytes is None
    assert s.utilization_gpu_pct is None
    assert s.temperature_c is None and s.temperature_slowdown_c is None
    assert s.power_draw_w is None and s.power_limit_w is None
    assert s.sm_clock_mhz is None and s.clock_event_reasons is None
    assert s.ecc == EccCounts()
    assert s.retired_pages_pending is None
    assert s.remapped_rows == RemappedRows()
    assert s.pcie == PcieLink()
    assert s.processes == () and s.processes_unreadable is not None
    assert s.known_processes is None  # unknown, not "no processes"
    assert s.persistence_mode is None and s.compute_capability is None
    assert s.unreachable is None  # unsupported readings are not a lost GPU


def test_older_driver_falls_back_to_throttle_reasons() -> None:
    gpu = h100(errors={"nvmlDeviceGetCurrentClocksEventReasons": "FunctionNotFound"})
    assert backend_for(gpu).sample(0).reasons == ClockEventReason.HW_SLOWDOWN


def test_driver_versions() -> None:
    assert backend_for(cuda=12040).driver() == DriverInfo("550.54.15", (12, 4))
    assert backend_for(version="535.98", cuda=12020).driver() == DriverInfo("535.98", (12, 2))


def test_sample_all_reads_every_gpu_and_close_shuts_down_once() -> None:
    second = h100(uuid="GPU-second", pci_bus_id="00000000:5E:00.0", cc=[8, 0])
    nvml = build(state(h100(), second))
    backend = NvmlBackend(nvml)
    samples = sample_all(backend)
    assert [(s.index, s.uuid, s.pci_bus_id, s.compute_capability) for s in samples] == [
        (0, "GPU-5f1c2d3e-0000-1111-2222-333344445555", "0000:3b:00.0", (9, 0)),
        (1, "GPU-second", "0000:5e:00.0", (8, 0)),
    ]
    backend.close()
    backend.close()
    assert nvml.calls.count("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("LibraryNotFound", "no NVIDIA driver: libnvidia-ml.so was not found"),
        ("DriverNotLoaded", "the NVIDIA kernel driver is not loaded"),
        ("NoPermission", "no permission to talk to the NVIDIA driver"),
        ("Unknown", "NVML failed to start: Unknown Error"),
    ],
)
def test_open_without_driver_gives_no_gpu_backend(
    monkeypatch: pytest.MonkeyPatch, error: str, reason: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", build(state(h100(), init_error=error)))
    backend = open_nvml()
    assert isinstance(backend, NoGpuBackend)
    assert (backend.kind, backend.absent_reason, backend.driver(), backend.device_count()) == (
        "none",
        reason,
        None,
        0,
    )


def test_open_with_driver_gives_nvml_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", build(state(h100())))
    backend = open_nvml()
    assert backend.kind == "nvml"
    assert backend.device_count() == 1


# --- the process query on older and broken drivers ----------------------------------------


def test_a_driver_without_the_v3_process_query_falls_back_to_v2() -> None:
    """nvidia-ml-py raises NVMLLibraryMismatchError, a plain Exception, on R495 and older."""
    gpu = h100(processes=[[os.getpid(), GIB]])
    nvml = build(state(gpu, process_query="v2_only"))
    backend = NvmlBackend(nvml)
    for _ in range(3):
        s = backend.sample(0)
        assert [p.pid for p in s.processes] == [os.getpid()]
        assert s.processes_unreadable is None
    # The v3 call failed once; the backend remembers and asks v2 from then on.
    assert nvml.calls.count("nvmlDeviceGetComputeRunningProcesses") == 1
    assert nvml.calls.count("nvmlDeviceGetComputeRunningProcesses_v2") == 3


def test_impossible_pids_from_the_v3_query_switch_to_v2() -> None:
    """The 535.98 driver fills v2 structures for the v3 call: pids come back garbled."""
    gpu = h100(processes=[[os.getpid(), GIB], [GHOST_PID, 3 * GIB]])
    s = backend_for(gpu, process_query="v3_garbled").sample(0)
    assert [(p.pid, p.used_memory_bytes) for p in s.processes] == [
        (os.getpid(), GIB),
        (GHOST_PID, 3 * GIB),
    ]


def test_no_permission_for_processes_is_unknown_not_none() -> None:
    gpu = h100(errors={"nvmlDeviceGetComputeRunningProcesses": "NoPermission"})
    s = backend_for(gpu).sample(0)
    assert s.known_processes is None
    assert s.processes_unreadable is not None and "Permission" in s.processes_unreadable
    assert s.memory_used_bytes == 2 * GIB  # the rest of the reading is intact


# --- a GPU lost from the bus ----------------------------------------------------------------


@pytest.mark.parametrize("error", ["GpuIsLost", "ResetRequired", "Unknown"])
def test_a_lost_gpu_is_unreachable_and_keeps_only_identities_read_before(error: str) -> None:
    nvml = build(state(h100(), h100(uuid="GPU-other", pci_bus_id="00000000:5E:00.0")))
    backend = NvmlBackend(nvml)
    before = backend.sample(0)
    nvml.state["devices"][0]["lost"] = error
    handles_before = nvml.calls.count("nvmlDeviceGetHandleByIndex")
    lost = backend.sample(0)
    assert lost.unreachable is not None and error in lost.unreachable
    assert (lost.name, lost.uuid, lost.pci_bus_id) == (before.name, before.uuid, before.pci_bus_id)
    assert lost.memory_total_bytes is None and lost.temperature_c is None
    assert lost.processes == () and lost.mig_devices == ()
    # The other GPU still reads.
    assert backend.sample(1).unreachable is None
    # The stale handle was dropped: the next reading asks for a new one, and a
    # GPU back after a reset reads again.
    del nvml.state["devices"][0]["lost"]
    again = backend.sample(0)
    assert nvml.calls.count("nvmlDeviceGetHandleByIndex") > handles_before + 1
    assert again.unreachable is None and again.memory_total_bytes == 80 * GIB


def test_a_gpu_lost_before_it_was_ever_read_has_no_invented_uuid() -> None:
    nvml = build(state(h100(lost="GpuIsLost", lost_at_handle=True)))
    s = NvmlBackend(nvml).sample(0)
    assert s.unreachable is not None and "GpuIsLost" in s.unreachable
    assert s.uuid is None and s.pci_bus_id is None
    assert s.name == "GPU 0"


def test_a_gpu_lost_mid_reading_stops_asking_it() -> None:
    nvml = build(state(h100(lost="GpuIsLost")))
    s = NvmlBackend(nvml).sample(0)
    assert s.unreachable is not None
    # Each query of a lost GPU can block in the driver: the first answer ends the reading.
    device_calls = [c for c in nvml.calls if c.startswith("nvmlDevice")]
    assert device_calls == ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName"]


# --- MIG --------------------------------------------------------------------------------------


def mig_gpu(**mig: object) -> dict:
    instances = [
        {
            "uuid": "MIG-aaaa",
            "gi": 1,
            "ci": 0,
            "memory_total": 40 * GIB,
            "memory_used": 10 * GIB,
            "processes": [[os.getpid(), 9 * GIB]],
        },
        {
            "uuid": "MIG-bbbb",
            "gi": 2,
            "ci": 0,
            "memory_total": 40 * GIB,
            "memory_used": 20 * GIB,
            "processes": [[GHOST_PID, None]],
        },
    ]
    return h100(mig={"mode": 1, "devices": instances, **mig})


def test_mig_instances_are_read_and_their_processes_joined() -> None:
    s = backend_for(mig_gpu()).sample(0)
    assert s.mig_mode is True
    assert s.mig_devices == (
        MigDevice("MIG-aaaa", 1, 0, 40 * GIB, 10 * GIB),
        MigDevice("MIG-bbbb", 2, 0, 40 * GIB, 20 * GIB),
    )
    # The whole GPU's list needs privileges; the instances' lists do not.
    assert {p.pid for p in s.processes} == {os.getpid(), GHOST_PID}
    assert s.processes_unreadable is None
    # What MIG hides on the whole GPU.
    assert s.utilization_gpu_pct is None
    assert s.remapped_rows == RemappedRows()


def test_mig_instances_that_cannot_be_listed_leave_processes_unknown() -> None:
    gpu = mig_gpu()
    gpu["errors"] = {"nvmlDeviceGetMigDeviceHandleByIndex": "NoPermission"}
    s = backend_for(gpu).sample(0)
    assert s.mig_mode is True and s.mig_devices == ()
    assert s.known_processes is None
    assert s.processes_unreadable is not None and "MIG" in s.processes_unreadable


def test_mig_capable_gpu_with_mig_off() -> None:
    s = backend_for(h100(mig={"mode": 0}, processes=[[os.getpid(), GIB]])).sample(0)
    assert s.mig_mode is False and s.mig_devices == ()
    assert [p.pid for p in s.processes] == [os.getpid()]
    assert s.utilization_gpu_pct == 87.0
