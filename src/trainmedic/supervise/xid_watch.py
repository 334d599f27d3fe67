"""Xid errors while the job runs, recorded as ``xid`` run events.

Two sources, the richer first:

* the kernel log (``/dev/kmsg``, read as records arrive): the driver's line
  names the GPU's PCI bus, the process and the details (Xid 154's recovery
  action); usually readable only by root;
* NVML's Xid events (``nvmlDeviceRegisterEvents``): the code and the GPU,
  for any user.

A simulated backend is its own source (its simulated kernel log). Each event
carries ``data``: ``xid`` (code), ``gpu`` (NVML index, when known),
``pci_bus_id``, ``gpu_instance`` (MIG), ``pid``, ``detail``, ``action`` (the
catalogue's, :mod:`trainmedic.gpu.faults`) and ``source``; its message is the
kernel line. ``diagnose/hardware.py`` turns them into findings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from trainmedic.gpu.backend import GpuBackend, XidNotice, XidWatch
from trainmedic.gpu.faults import GPU_AT_RE, XidEvent, parse_xid_line
from trainmedic.gpu.types import GpuSample, normalize_pci_bus_id
from trainmedic.host.kernel_log import KmsgFollower
from trainmedic.record.types import RunEvent

PERIOD_S = 1.0
"""Seconds between reads of the kernel log (and the longest wait on NVML's events)."""
MAX_EVENTS = 1000
"""Xid events recorded per run at most: a GPU in an error loop logs thousands."""


class XidWatcher:
    """Reads new Xids each round and hands them to ``sink`` as run events.

    Args:
        gpus: the latest reading of each GPU by index (to name a GPU by its bus id).
        kmsg: the kernel log follower; ``None`` opens ``/dev/kmsg`` (NVML backends only).
    """

    def __init__(
        self,
        backend: GpuBackend,
        sink: Callable[[RunEvent], None],
        gpus: Callable[[], Mapping[int, GpuSample]],
        kmsg: KmsgFollower | None = None,
        wall: Callable[[], float] = time.time,
        period_s: float = PERIOD_S,
    ) -> None:
        self._sink = sink
        self._gpus = gpus
        self._wall = wall
        self.period_s = period_s
        self._kmsg: KmsgFollower | None = None
        self._watch: XidWatch | None = None
        self._uuid_by_bus: dict[str, str] = {}
        self.recorded = 0
        if backend.kind == "nvml":
            follower = kmsg if kmsg is not None else KmsgFollower()
            if follower.opened:
                self._kmsg = follower
        if self._kmsg is None:
            self._watch = backend.xid_watch()

    @property
    def source(self) -> str | None:
        """``"kernel log"``, ``"nvml"`` (or the simulated log), or ``None`` when blind."""
        if self._kmsg is not None:
            return "kernel log"
        return "nvml" if self._watch is not None else None

    def sample_once(self) -> float:
        """One round; returns seconds until the next (inf when there is no source)."""
        if self._kmsg is not None:
            for line in self._kmsg.poll():
                self._line(line, None)
            return self.period_s
        if self._watch is not None:
            start = time.monotonic()
            for notice in self._watch.wait(self.period_s):
                self._notice(notice)
            return max(0.0, self.period_s - (time.monotonic() - start))
        return float("inf")

    def _notice(self, notice: XidNotice) -> None:
        if notice.line is not None:
            self._line(notice.line, notice.gpu_index)
            return
        self._emit(
            XidEvent(notice.code, None, notice.gpu_instance, None, None, "", ""),
            notice.gpu_index,
            f"Xid {notice.code} on GPU {notice.gpu_index} (NVML event)",
        )

    def _line(self, line: str, index: int | None) -> None:
        m = GPU_AT_RE.search(line)
        if m is not None:
            self._uuid_by_bus[normalize_pci_bus_id(m[1])] = m[2]
            return
        event = parse_xid_line(line)
        if event is not None:
            self._emit(event, index, event.line)

    def _emit(self, event: XidEvent, index: int | None, message: str) -> None:
        if self.recorded >= MAX_EVENTS:
            return
        self.recorded += 1
        gpus = self._gpus()
        bus = event.pci_bus_id
        if index is None and bus is not None:
            index = next((i for i, g in gpus.items() if g.pci_bus_id == bus), None)
        if bus is None and index is not None and index in gpus:
            bus = gpus[index].pci_bus_id
        verdict = event.verdict
        data: dict[str, Any] = {
            "xid": event.code,
            "action": verdict.action.value,
            "source": self.source,
        }
        for key, value in (
            ("gpu", index),
            ("pci_bus_id", bus),
            ("uuid", self._uuid_by_bus.get(bus or "")),
            ("gpu_instance", event.gpu_instance),
            ("pid", event.pid),
            ("detail", event.detail or None),
        ):
            if value is not None:
                data[key] = value
        self._sink(RunEvent(t=self._wall(), kind="xid", message=message, data=data))

    def close(self) -> None:
        if self._kmsg is not None:
            self._kmsg.close()
        if self._watch is not None:
            self._watch.close()
