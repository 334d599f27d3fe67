"""The job's processes as the probes report them, and where each probe message goes.

:class:`ProcessTable` keeps, per process, its hello, its torch, its last
heartbeat and whether it said goodbye: what a watchdog needs to tell a
process making progress from one that is stuck. :class:`MessageRouter` takes
every decoded channel message and sends records to the run record's writer
and the live view, and process messages to the table (process starts and
exits also become events of the record).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from trainmedic.channel.wire import Goodbye, Heartbeat, Hello, ProbeMessage, TorchInfo
from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind
from trainmedic.record.payloads import ProcessStart
from trainmedic.record.types import HostSample, LoaderActivity, LoaderInfo, RunEvent, StepRecord


@dataclass(frozen=True)
class ProcessState:
    """One process of the job as its probe described it.

    Attributes:
        last_heartbeat: the latest heartbeat, ``None`` before the first.
        exited_at: Unix time of its goodbye, ``None`` while it runs (or if it died).
        heartbeat_received: Unix time the latest heartbeat arrived (its ``t`` is
            when it was sent: the difference is its time in transit).
        trains: whether a train step of it arrived (its heartbeats may be seconds
            apart while its steps flow through the shared-memory ring).
        loads: whether it described a DataLoader it iterates.
        sampled_since: Unix time (the supervisor's) it first trained or described a
            DataLoader: from when its stacks are worth sampling.
    """

    hello: Hello
    torch: TorchInfo | None = None
    last_heartbeat: Heartbeat | None = None
    exited_at: float | None = None
    heartbeat_received: float | None = None
    trains: bool = False
    loads: bool = False
    sampled_since: float | None = None

    @property
    def sampled(self) -> bool:
        """Whether its stacks are worth sampling: it trains or reads a DataLoader."""
        return self.trains or self.loads


class ProcessTable:
    """Thread-safe map of pid -> :class:`ProcessState`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pid: dict[int, ProcessState] = {}

    def hello(self, message: Hello) -> bool:
        """Record a hello; ``True`` when the process is new."""
        with self._lock:
            known = self._by_pid.get(message.pid)
            if known is None:
                self._by_pid[message.pid] = ProcessState(hello=message)
                return True
            self._by_pid[message.pid] = replace(known, hello=message)
            return False

    def update(self, pid: int, **changes: object) -> None:
        with self._lock:
            known = self._by_pid.get(pid)
            if known is not None:
                self._by_pid[pid] = replace(known, **changes)  # type: ignore[arg-type]

    def get(self, pid: int) -> ProcessState | None:
        with self._lock:
            return self._by_pid.get(pid)

    def snapshot(self) -> dict[int, ProcessState]:
        with self._lock:
            return dict(self._by_pid)

    def torch_info(self) -> TorchInfo | None:
        """The most informative torch report: one with CUDA initialised if any."""
        with self._lock:
            infos = [s.torch for s in self._by_pid.values() if s.torch is not None]
        ready = [i for i in infos if i.cuda_initialized]
        best = ready or infos
        return best[0] if best else None


class RecordSink(Protocol):
    """Where records go (the run record's writer, the live view)."""

    def add_step(self, step: StepRecord) -> None: ...

    def add_gpu(self, sample: GpuSample) -> None: ...

    def add_host(self, sample: HostSample) -> None: ...

    def add_loader(self, info: LoaderInfo) -> None: ...

    def add_loader_activity(self, activity: LoaderActivity) -> None: ...

    def add_event(self, event: RunEvent) -> None: ...


class IgnoringSink:
    """A record sink that ignores every kind of record: a sink that uses only a
    few kinds inherits from it and defines those."""

    def add_step(self, step: StepRecord) -> None:
        return None

    def add_gpu(self, sample: GpuSample) -> None:
        return None

    def add_host(self, sample: HostSample) -> None:
        return None

    def add_loader(self, info: LoaderInfo) -> None:
        return None

    def add_loader_activity(self, activity: LoaderActivity) -> None:
        return None

    def add_event(self, event: RunEvent) -> None:
        return None


class MessageRouter:
    """Fans probe messages and sampler readings out to ``sinks`` and the process table."""

    def __init__(
        self, sinks: list[RecordSink], table: ProcessTable, wall: Callable[[], float]
    ) -> None:
        self.sinks = sinks
        self.table = table
        self._wall = wall
        self._training: set[int] = set()  # pids a train step came from (channel thread)
        self._loading: set[int] = set()  # pids that described a DataLoader

    # --- sampler readings -------------------------------------------------------------------

    def add_gpu(self, sample: GpuSample) -> None:
        for s in self.sinks:
            s.add_gpu(sample)

    def add_host(self, sample: HostSample) -> None:
        for s in self.sinks:
            s.add_host(sample)

    def add_event(self, event: RunEvent) -> None:
        for s in self.sinks:
            s.add_event(event)

    # --- the channel -------------------------------------------------------------------------

    def on_message(self, message: ProbeMessage) -> None:
        if isinstance(message, StepRecord):
            for s in self.sinks:
                s.add_step(message)
            if message.pid not in self._training and message.phase == "train":
                self._training.add(message.pid)
                self.table.update(message.pid, trains=True)
                self._sampled_from(message.pid)
        elif isinstance(message, Heartbeat):
            self.table.update(message.pid, last_heartbeat=message, heartbeat_received=self._wall())
        elif isinstance(message, LoaderActivity):
            for s in self.sinks:
                s.add_loader_activity(message)
        elif isinstance(message, LoaderInfo):
            for s in self.sinks:
                s.add_loader(message)
            if message.pid not in self._loading:
                self._loading.add(message.pid)
                self.table.update(message.pid, loads=True)
                self._sampled_from(message.pid)
        elif isinstance(message, RunEvent):
            self.add_event(message)
        elif isinstance(message, Hello):
            self._hello(message)
        elif isinstance(message, TorchInfo):
            self.table.update(message.pid, torch=message)
        elif isinstance(message, Goodbye):
            self.table.update(message.pid, exited_at=message.t)
            usage = {
                key: getattr(message, key)
                for key in ("probe_cpu_s", "probe_wall_s", "stack_samples")
                if getattr(message, key) is not None
            }
            self.add_event(
                RunEvent(
                    t=message.t,
                    kind=EventKind.PROCESS_EXIT,
                    message=f"process {message.pid} exited",
                    pid=message.pid,
                    data=usage,
                )
            )

    def _sampled_from(self, pid: int) -> None:
        state = self.table.get(pid)
        if state is not None and state.sampled_since is None:
            self.table.update(pid, sampled_since=self._wall())

    def _hello(self, h: Hello) -> None:
        new = self.table.hello(h)
        what = " ".join(h.argv) if h.argv else h.executable
        if len(what) > 200:
            what = what[:197] + "..."
        self.add_event(
            RunEvent(
                t=h.t,
                kind=EventKind.PROCESS_START if new else EventKind.PROCESS_ROLE,
                message=f"{h.role} {h.pid}: {what}"
                if new
                else f"process {h.pid} is now a {h.role}",
                pid=h.pid,
                data=ProcessStart(
                    pid=h.pid,
                    ppid=h.ppid,
                    role=h.role,
                    rank=h.rank,
                    local_rank=h.local_rank,
                    node=h.node,
                    node_rank=h.node_rank,
                    world_size=h.world_size,
                    argv=tuple(h.argv),
                    python=h.python,
                ).to_data(),
            )
        )

    def on_problem(self, text: str) -> None:
        """A channel problem (bad connection, failing consumer) becomes one event."""
        self.add_event(RunEvent(t=self._wall(), kind=EventKind.CHANNEL_ERROR, message=text))
