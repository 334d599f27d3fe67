"""Xid errors while the job runs, recorded as ``xid`` run events.

Two sources, used together:

* the kernel log (``/dev/kmsg``, read as records arrive): the driver's line
  names the GPU's PCI bus, the process and the details (Xid 154's recovery
  action); usually readable only by root;
* NVML's Xid events (``nvmlDeviceRegisterEvents``): the code and the GPU,
  for any user.

The same Xid usually comes from both: an NVML event is held for
:data:`HOLD_S` and dropped when the kernel log's richer line for the same
code and GPU arrives meanwhile (or arrived just before). A simulated backend
is its own source (its simulated kernel log). Each event
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
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent

PERIOD_S = 1.0
"""Seconds between reads of the kernel log (and the longest wait on NVML's events)."""
HOLD_S = 3.0
"""Seconds an NVML event waits for the kernel log's line of the same Xid."""
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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink = sink
        self._gpus = gpus
        self._wall = wall
        self.period_s = period_s
        self._monotonic = monotonic
        self._kmsg: KmsgFollower | None = None
        self._watch: XidWatch | None = None
        self._uuid_by_bus: dict[str, str] = {}
        self._held: list[tuple[float, XidNotice]] = []  # NVML events awaiting the log's line
        self._logged: list[tuple[float, int, int | None]] = []  # (when, code, gpu) from the log
        self.recorded = 0
        self._line_source = "simulated kernel log" if backend.kind == "simulated" else "kernel log"
        if backend.kind == "nvml":
            follower = kmsg if kmsg is not None else KmsgFollower()
            if follower.opened:
                self._kmsg = follower
        self._watch = backend.xid_watch()

    @property
    def source(self) -> str | None:
        """Where Xids come from: ``"kernel log"``, ``"nvml"``, both joined by ``+``,
        or ``None`` when nothing can be watched."""
        names = [n for n, s in (("kernel log", self._kmsg), ("nvml", self._watch)) if s]
        return "+".join(names) or None

    def sample_once(self) -> float:
        """One round; returns seconds until the next (inf when there is no source)."""
        if self.source is None:
            return float("inf")
        start = self._monotonic()
        if self._kmsg is not None:
            for line in self._kmsg.poll():
                self._line(line, None)
        if self._watch is not None:
            # Without the log to read, the wait on NVML's events is the round's pause.
            wait = 0.0 if self._kmsg is not None else self.period_s
            for notice in self._watch.wait(wait):
                self._notice(notice)
        self._release(self._monotonic() - HOLD_S)
        return max(0.0, self.period_s - (self._monotonic() - start))

    def _notice(self, notice: XidNotice) -> None:
        if notice.line is not None:
            self._line(notice.line, notice.gpu_index)
        elif self._kmsg is None:
            self._emit_notice(notice)
        elif not self._seen_in_log(notice):
            self._held.append((self._monotonic(), notice))

    def _seen_in_log(self, notice: XidNotice) -> bool:
        recent = self._monotonic() - HOLD_S
        return any(
            t >= recent and code == notice.code and gpu in (None, notice.gpu_index)
            for t, code, gpu in self._logged
        )

    def _release(self, before: float) -> None:
        """Emit held NVML events older than ``before`` whose log line never came."""
        keep = []
        for t, notice in self._held:
            if self._seen_in_log(notice):
                continue
            if t <= before:
                self._emit_notice(notice)
            else:
                keep.append((t, notice))
        self._held = keep
        self._logged = [x for x in self._logged if x[0] >= self._monotonic() - 2 * HOLD_S]

    def _emit_notice(self, notice: XidNotice) -> None:
        self._emit(
            XidEvent(notice.code, None, notice.gpu_instance, None, None, "", ""),
            notice.gpu_index,
            f"Xid {notice.code} on GPU {notice.gpu_index} (NVML event)",
            "nvml",
        )

    def _line(self, line: str, index: int | None) -> None:
        m = GPU_AT_RE.search(line)
        if m is not None:
            self._uuid_by_bus[normalize_pci_bus_id(m[1])] = m[2]
            return
        event = parse_xid_line(line)
        if event is not None:
            index = self._emit(event, index, event.line, self._line_source)
            self._logged.append((self._monotonic(), event.code, index))

    def _emit(self, event: XidEvent, index: int | None, message: str, source: str) -> int | None:
        gpus = self._gpus()
        bus = event.pci_bus_id
        if index is None and bus is not None:
            index = next((i for i, g in gpus.items() if g.pci_bus_id == bus), None)
        if self.recorded >= MAX_EVENTS:
            return index
        self.recorded += 1
        if bus is None and index is not None and index in gpus:
            bus = gpus[index].pci_bus_id
        verdict = event.verdict
        data: dict[str, Any] = {
            "xid": event.code,
            "action": verdict.action.value,
            "source": source,
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
        self._sink(RunEvent(t=self._wall(), kind=EventKind.XID, message=message, data=data))
        return index

    def close(self) -> None:
        """Emit what is still held, then release the sources."""
        self._release(float("inf"))
        if self._kmsg is not None:
            self._kmsg.close()
        if self._watch is not None:
            self._watch.close()
