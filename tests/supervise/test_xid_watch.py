"""Xids during a run become ``xid`` events, from the kernel log or the driver's events."""

from __future__ import annotations

import os
from pathlib import Path

from trainmedic.gpu.backend import XidNotice
from trainmedic.gpu.simulated import SimulatedBackend
from trainmedic.gpu.types import GpuSample
from trainmedic.host.kernel_log import KmsgFollower, read_driver_lines, split_record
from trainmedic.record.types import RunEvent
from trainmedic.supervise.observe.xid_watch import XidWatcher

GPUS = {
    0: GpuSample(0.0, 0, "NVIDIA H100", "GPU-aaaa", pci_bus_id="0000:01:00.0"),
    1: GpuSample(0.0, 1, "NVIDIA H100", "GPU-bbbb", pci_bus_id="0000:41:00.0"),
}


class FakeBackend:
    """An NVML-like backend whose Xid events are queued by the test."""

    kind = "nvml"

    def __init__(self) -> None:
        self.queued: list[XidNotice] = []
        self.closed = False

    def xid_watch(self) -> FakeBackend:
        return self

    def wait(self, timeout_s: float) -> list[XidNotice]:
        out, self.queued = self.queued, []
        return out

    def close(self) -> None:
        self.closed = True


def kmsg_file(tmp_path: Path) -> tuple[Path, KmsgFollower]:
    path = tmp_path / "kmsg"
    path.write_text("6,1,100,-;NVRM: Xid (PCI:0000:01:00): 79, logged before the run\n")
    return path, KmsgFollower(str(path))


def append(path: Path, *messages: str) -> None:
    with path.open("a") as f:
        for i, m in enumerate(messages):
            f.write(f"4,{10 + i},{5_000_000 + i},-;{m}\n NVRM_DEVICE=+pci:0000:41:00.0\n")


def test_kernel_log_lines_logged_during_the_run_become_events(tmp_path: Path) -> None:
    path, follower = kmsg_file(tmp_path)
    events: list[RunEvent] = []
    watcher = XidWatcher(FakeBackend(), events.append, lambda: GPUS, kmsg=follower)  # type: ignore[arg-type]
    assert watcher.source == "kernel log+nvml"
    watcher.sample_once()
    assert events == []  # what was logged before the run is doctor's business
    append(
        path,
        "NVRM: GPU at PCI:0000:41:00: GPU-bbbb-cccc",
        "NVRM: Xid (PCI:0000:41:00 GPU-I:05): 94, pid=2451, name=python3, Contained: SM (0x1).",
        "usb 1-1: new device",
    )
    watcher.sample_once()
    (event,) = events
    assert event.kind == "xid"
    assert event.message.startswith("NVRM: Xid (PCI:0000:41:00 GPU-I:05): 94")
    assert event.data == {
        "xid": 94,
        "action": "restart_app",
        "source": "kernel log",
        "gpu": 1,
        "pci_bus_id": "0000:41:00.0",
        "uuid": "GPU-bbbb-cccc",
        "gpu_instance": 5,
        "pid": 2451,
        "detail": "pid=2451, name=python3, Contained: SM (0x1).",
    }
    watcher.close()


def test_an_xid_from_both_sources_is_recorded_once_with_the_kernel_line(tmp_path: Path) -> None:
    path, follower = kmsg_file(tmp_path)
    backend = FakeBackend()
    now = [100.0]
    events: list[RunEvent] = []
    watcher = XidWatcher(
        backend, events.append, lambda: GPUS, kmsg=follower, monotonic=lambda: now[0]  # type: ignore[arg-type]
    )
    backend.queued = [XidNotice(code=48, gpu_index=1)]  # NVML is quicker than the log
    watcher.sample_once()
    assert events == []  # held, waiting for the log's line
    append(path, "NVRM: Xid (PCI:0000:41:00): 48, pid=7, name=python, DBE")
    now[0] += 1.0
    watcher.sample_once()
    now[0] += 10.0
    watcher.sample_once()
    assert [(e.data["xid"], e.data["gpu"], e.data["source"]) for e in events] == [
        (48, 1, "kernel log")
    ]
    # An NVML event the log never shows (another container's log, a filtered line)
    # is recorded once it has waited long enough.
    backend.queued = [XidNotice(code=79, gpu_index=0)]
    watcher.sample_once()
    now[0] += 5.0
    watcher.sample_once()
    assert [(e.data["xid"], e.data["source"]) for e in events[1:]] == [(79, "nvml")]
    watcher.close()


def test_without_a_readable_kernel_log_nvml_events_are_used(tmp_path: Path) -> None:
    backend = FakeBackend()
    events: list[RunEvent] = []
    unreadable = KmsgFollower(str(tmp_path / "missing"))
    watcher = XidWatcher(backend, events.append, lambda: GPUS, kmsg=unreadable)  # type: ignore[arg-type]
    assert watcher.source == "nvml"
    backend.queued = [XidNotice(code=79, gpu_index=0)]
    watcher.sample_once()
    (event,) = events
    assert event.data["xid"] == 79 and event.data["gpu"] == 0
    assert event.data["pci_bus_id"] == "0000:01:00.0"
    assert event.data["action"] == "drain_node"
    watcher.close()
    assert backend.closed


def test_a_simulated_kernel_log_falls_due_on_the_backends_clock() -> None:
    now = [0.0]
    backend = SimulatedBackend.from_dict(
        {
            "driver": {"version": "550.54.15"},
            "gpus": [
                {
                    "name": "NVIDIA H100",
                    "uuid": "GPU-aaaa",
                    "memory_total_bytes": 1 << 30,
                    "pci_bus_id": "0000:01:00.0",
                    "kernel_log": [{"t": 2, "line": "NVRM: Xid (PCI:0000:01:00): 48, DBE"}],
                }
            ],
        },
        clock=lambda: now[0],
    )
    events: list[RunEvent] = []
    watcher = XidWatcher(backend, events.append, lambda: GPUS)
    assert watcher.source == "nvml"
    watcher.sample_once()
    assert events == []
    now[0] = 2.5
    watcher.sample_once()
    watcher.sample_once()
    assert [(e.data["xid"], e.data["gpu"]) for e in events] == [(48, 0)]


def test_no_source_no_thread() -> None:
    backend = SimulatedBackend.from_dict({"driver": None, "gpus": []})
    watcher = XidWatcher(backend, lambda e: None, dict)
    assert watcher.source is None
    assert watcher.sample_once() == float("inf")


def test_driver_lines_since_boot_for_doctor(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(
        "6,1,100,-;NVRM: GPU at PCI:0000:01:00: GPU-aaaa\n"
        " SUBSYSTEM=pci\n"
        "4,2,200,-;NVRM: Xid (PCI:0000:01:00): 63, Row Remapper: New row marked\n"
        "6,3,300,-;EXT4-fs mounted\n"
    )
    assert read_driver_lines(str(path), journal=False) == (
        "NVRM: GPU at PCI:0000:01:00: GPU-aaaa",
        "NVRM: Xid (PCI:0000:01:00): 63, Row Remapper: New row marked",
    )
    assert read_driver_lines(str(tmp_path / "missing"), journal=False) is None
    assert split_record("4,2,2500000,-;hello") == (2.5, "hello")
    if not os.access("/dev/kmsg", os.R_OK):
        assert not KmsgFollower().opened
