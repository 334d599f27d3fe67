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
import threading
import types

import pytest
from standin_nvml import GIB, MIB, NOT_AVAILABLE, build, h100, state

from trainmedic.gpu.backend import NoGpuBackend, sample_all
from trainmedic.gpu.nvml import PCIE_THROUGHPUT_PERIOD_S, NvmlBackend, open_nvml
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
    # Each query of a lost GPU can block in the driver: the core query's second
    # answer ends the reading.
    device_calls = [c for c in nvml.calls if c.startswith("nvmlDevice")]
    assert device_calls == [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetPciInfo",
    ]


# --- answers that are not a lost GPU ---------------------------------------------------------

OPTIONAL_QUERIES = (
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses",
)


@pytest.mark.parametrize("error", ["Unknown", "NoPermission", "GpuIsLost"])
def test_optional_queries_refused_leave_the_gpu_reachable_and_say_which(error: str) -> None:
    nvml = build(state(h100(errors={q: error for q in OPTIONAL_QUERIES})))
    backend = NvmlBackend(nvml)
    first, second = backend.sample(0), backend.sample(0)
    for s in (first, second):
        assert s.unreachable is None
        assert s.memory_total_bytes == 80 * GIB and s.temperature_c == 71.0
        assert s.ecc == EccCounts() and s.retired_pages_pending is None
        assert s.unavailable is not None
        assert f"ECC counts ({error})" in s.unavailable
        assert f"retired pages ({error})" in s.unavailable
        assert s.processes_unreadable is not None and error in s.processes_unreadable
    assert f"PCIe throughput ({error})" in (first.unavailable or "")
    # The handle is kept: a healthy GPU is not looked up again.
    assert nvml.calls.count("nvmlDeviceGetHandleByIndex") == 1


def test_not_supported_is_not_named_as_unavailable() -> None:
    s = backend_for(h100(errors={"nvmlDeviceGetTotalEccErrors": "NotSupported"})).sample(0)
    assert s.ecc == EccCounts() and s.unavailable is None


def test_a_core_query_failing_once_is_a_hiccup_not_a_lost_gpu() -> None:
    gpu = h100(
        fail_next={"nvmlDeviceGetMemoryInfo": ["Unknown"], "nvmlDeviceGetPciInfo": ["GpuIsLost"]}
    )
    s = backend_for(gpu).sample(0)
    assert s.unreachable is None
    assert s.memory_total_bytes == 80 * GIB and s.pci_bus_id == "0000:3b:00.0"


@pytest.mark.parametrize("error", ["Unknown", "GpuIsLost", "ResetRequired"])
def test_a_core_query_failing_twice_is_a_lost_gpu(error: str) -> None:
    gpu = h100(fail_next={"nvmlDeviceGetMemoryInfo": [error, error]})
    s = backend_for(gpu).sample(0)
    assert s.unreachable is not None and error in s.unreachable
    assert s.memory_total_bytes is None


def test_an_optional_lost_answer_is_confirmed_by_a_core_query() -> None:
    # ECC answers GpuIsLost; memory answers at the start, then not on the re-check.
    gpu = h100(
        errors={"nvmlDeviceGetTotalEccErrors": "GpuIsLost"},
        fail_next={"nvmlDeviceGetMemoryInfo": [None, "GpuIsLost", "GpuIsLost"]},
    )
    nvml = build(state(gpu))
    s = NvmlBackend(nvml).sample(0)
    assert s.unreachable is not None and "GpuIsLost" in s.unreachable
    assert nvml.calls.count("nvmlDeviceGetMemoryInfo") == 3


def test_a_handle_refused_without_permission_is_not_a_lost_gpu() -> None:
    nvml = build(state(h100(errors={"nvmlDeviceGetHandleByIndex": "NoPermission"})))
    s = NvmlBackend(nvml).sample(0)
    assert s.unreachable is None
    assert s.unavailable is not None and "NoPermission" in s.unavailable
    assert s.name == "GPU 0" and s.uuid is None and s.memory_total_bytes is None


def test_removed_throttle_spelling_is_no_attribute_error() -> None:
    gpu = h100(errors={"nvmlDeviceGetCurrentClocksEventReasons": "FunctionNotFound"})
    nvml = build(state(gpu, removed=["nvmlDeviceGetCurrentClocksThrottleReasons"]))
    assert not hasattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    s = NvmlBackend(nvml).sample(0)
    assert s.clock_event_reasons is None and s.unreachable is None
    assert s.memory_total_bytes == 80 * GIB


# --- PCIe traffic ----------------------------------------------------------------------------


def test_pcie_traffic_comes_from_the_byte_counters_between_readings() -> None:
    nvml = build(state(h100(pcie_counters=[10 * MIB, 40 * MIB, 1_000_000])))
    backend = NvmlBackend(nvml)
    first = backend.sample(0)
    assert (first.pcie.tx_kib_per_s, first.pcie.rx_kib_per_s) == (None, None)  # no rate yet
    # 2 MiB sent and 8 MiB received in the half second the counters say passed.
    nvml.state["devices"][0]["pcie_counters"] = [12 * MIB, 48 * MIB, 1_500_000]
    second = backend.sample(0)
    assert (second.pcie.tx_kib_per_s, second.pcie.rx_kib_per_s) == (4096, 16384)
    # Counters that went back (a GPU reset) give no rate, not a negative one.
    nvml.state["devices"][0]["pcie_counters"] = [1 * MIB, 1 * MIB, 2_000_000]
    assert backend.sample(0).pcie.tx_kib_per_s is None
    # The 20 ms throughput window is never waited for.
    assert "nvmlDeviceGetPcieThroughput" not in nvml.calls
    assert second.pcie.gen_current == 5 and second.pcie.width_max == 16


def test_pcie_throughput_without_counters_is_asked_at_most_every_period() -> None:
    now = [100.0]
    nvml = build(state(h100()))  # no byte counters: the fields answer "not supported"
    backend = NvmlBackend(nvml, monotonic=lambda: now[0])
    assert backend.sample(0).pcie.tx_kib_per_s == 1200
    now[0] += PCIE_THROUGHPUT_PERIOD_S / 2
    assert backend.sample(0).pcie.tx_kib_per_s is None
    assert nvml.calls.count("nvmlDeviceGetPcieThroughput") == 2  # one reading's tx and rx
    now[0] += PCIE_THROUGHPUT_PERIOD_S
    assert backend.sample(0).pcie.rx_kib_per_s == 3400
    assert nvml.calls.count("nvmlDeviceGetPcieThroughput") == 4
    # The counters are not asked again once the driver said it lacks them.
    assert nvml.calls.count("nvmlDeviceGetFieldValues") == 1


# --- NVLink fabric -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fabric", "expected"),
    [
        (None, None),
        ([0, 0], None),  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: no NVSwitch
        ([1, 0], "not_started"),
        ([2, 0], "in_progress"),
        ([3, 0], "completed"),
        ([3, 999], "failed: Unknown Error (Unknown)"),
    ],
)
def test_fabric_registration_state(fabric: list[int] | None, expected: str | None) -> None:
    s = backend_for(h100(fabric=fabric)).sample(0)
    assert s.fabric == expected
    assert s.unavailable is None and s.unreachable is None


# --- shutdown ----------------------------------------------------------------------------------


def _blocking_memory_query(nvml: types.ModuleType) -> tuple[threading.Event, threading.Event]:
    """Make the memory query block until released; returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    answer = nvml.nvmlDeviceGetMemoryInfo

    def blocking(h: object) -> object:
        entered.set()
        release.wait(30)
        return answer(h)

    nvml.nvmlDeviceGetMemoryInfo = blocking  # type: ignore[attr-defined]
    return entered, release


def test_close_leaves_nvml_running_while_a_reading_is_inside_it() -> None:
    nvml = build(state(h100()))
    backend = NvmlBackend(nvml, close_wait_s=0.01)
    entered, release = _blocking_memory_query(nvml)
    reader = threading.Thread(target=backend.sample, args=(0,))
    reader.start()
    assert entered.wait(30)
    backend.close()
    assert "nvmlShutdown" not in nvml.calls  # shutting down would free the call's memory
    release.set()
    reader.join(30)
    with pytest.raises(RuntimeError, match="shut down"):
        backend.sample(0)  # nothing reads after close
    assert backend.device_count() == 0


def test_close_waits_for_the_reading_in_flight_then_shuts_down() -> None:
    nvml = build(state(h100()))
    backend = NvmlBackend(nvml, close_wait_s=30)
    entered, release = _blocking_memory_query(nvml)
    results: list[object] = []
    reader = threading.Thread(target=lambda: results.append(backend.sample(0)))
    reader.start()
    assert entered.wait(30)
    closer = threading.Thread(target=backend.close)
    closer.start()
    release.set()
    closer.join(30)
    reader.join(30)
    assert nvml.calls.count("nvmlShutdown") == 1
    # The reading ended before the shutdown began.
    assert nvml.calls.index("nvmlShutdown") > max(
        i for i, c in enumerate(nvml.calls) if c.startswith("nvmlDevice")
    )
    assert len(results) == 1


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
