"""The evidence a silence is judged by: one :class:`ProcessWindow` per process
of the job (the kernel's view, :class:`KernelView`, and the probe's,
:class:`StackView`), the classes of silence (:class:`Silence`) and the
verdicts (:class:`ProcessEvidence`, :class:`JobEvidence`). The rules that
classify them are in :mod:`trainmedic.resilience.silence`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trainmedic.resilience.places import Place, PlaceKind

ON_CPU_SHARE = 0.2
"""A process using at least this share of one core is on the CPU (the probe's
own thread, a few milliseconds a second, never reaches it)."""
GIL_BUSY_SHARE = 0.5
"""At least this share of the probe's samples found Python code running."""
STARVED_SHARE = 0.3
"""Waiting this share of the window for a CPU is starvation."""


class Silence(str, Enum):
    WORK = "work"
    BLOCKED = "blocked"
    SPINNING = "spinning"
    PEER_WAIT = "peer_wait"
    SOURCE_WAIT = "source_wait"
    UNCLEAR = "unclear"

    @property
    def hang(self) -> bool:
        """Evidence of a hang: bounded by the learned step bound."""
        return self in (
            Silence.BLOCKED,
            Silence.SPINNING,
            Silence.PEER_WAIT,
            Silence.SOURCE_WAIT,
        )


@dataclass(frozen=True)
class KernelView:
    """One process over the window, as ``/proc`` shows it.

    Attributes:
        span_s: the window's length, seconds.
        cpu_s: CPU seconds of all its threads but the probe's, in the window.
        run_wait_s: seconds its main thread waited for a CPU (run queue).
        wakeups: times its main thread was put on a CPU: one parked in a read
            that keeps waking is receiving data.
        io_bytes: bytes read and written (``rchar + wchar``) by its threads but
            the probe's: sockets, pipes, files.
        dirtied_bytes: bytes of page cache it dirtied (``write_bytes``): a large
            write in flight shows here before the call returns.
        growth_bytes: growth of the regular files it has open for writing.
        state: the main thread's state (``R``, ``S``, ``D``, ...).
        syscall: the main thread's system call (``read``, ``fsync``, ``futex``),
            ``running`` on the CPU, ``None`` when unreadable.
        target: what that call works on (a path, ``socket 10.0.0.5:9000``, ``pipe``).
        flushed_bytes: bytes the storage under ``target`` (or the whole machine)
            wrote in the window.
    """

    span_s: float
    cpu_s: float | None = None
    run_wait_s: float | None = None
    wakeups: int | None = None
    io_bytes: int | None = None
    dirtied_bytes: int | None = None
    growth_bytes: int | None = None
    state: str | None = None
    syscall: str | None = None
    target: str | None = None
    flushed_bytes: int | None = None

    @property
    def cpu_share(self) -> float | None:
        if self.cpu_s is None or self.span_s <= 0:
            return None
        return self.cpu_s / self.span_s

    @property
    def on_cpu(self) -> bool:
        share = self.cpu_share
        return share is not None and share >= ON_CPU_SHARE

    @property
    def starved(self) -> bool:
        return (
            self.run_wait_s is not None
            and self.span_s > 0
            and self.run_wait_s / self.span_s >= STARVED_SHARE
        )


@dataclass(frozen=True)
class StackView:
    """The probe's account of the training thread over the window.

    Attributes:
        place: where the latest heartbeat found it.
        fresh: that heartbeat is recent (the probe's thread is running).
        samples: stack samples the probe took in the window.
        gil_busy: samples that waited for running Python code to let go of
            the interpreter lock.
        work: growth of the count of outermost forward/backward/optimizer
            calls and DataLoader batches.
        novel: the thread reached code not seen before in this silence.
        places: distinct places (frames with lines) the heartbeats of this
            silence found the thread at: a spin-wait cycles through one to three.
        lag_s: seconds the latest heartbeat spent between the probe's send and
            the supervisor's receipt (``None``: unknown): a long one means the
            supervisor, not the job, is short of CPU.
        work_at / novel_at: when the heartbeat that showed the work (or the new
            code) was sent, on the observer's clock, seconds; ``None``: none showed.
    """

    place: Place
    fresh: bool = True
    samples: int = 0
    gil_busy: int = 0
    work: int = 0
    novel: bool = False
    lag_s: float | None = None
    places: int = 1
    work_at: float | None = None
    novel_at: float | None = None

    @property
    def python_running(self) -> bool:
        return self.samples > 0 and self.gil_busy / self.samples >= GIL_BUSY_SHARE


@dataclass(frozen=True)
class ProcessWindow:
    """Everything known about one process of the job over the window.

    Attributes:
        role: its probe's role (``process``, ``worker``, ...), ``unknown`` without one.
        probed: a probe runs in it.
        gpu_busy: a GPU it uses was busy (``None``: no readings).
    """

    pid: int
    role: str = "unknown"
    rank: int | None = None
    probed: bool = False
    kernel: KernelView | None = None
    stack: StackView | None = None
    gpu_busy: bool | None = None


@dataclass(frozen=True)
class ProcessEvidence:
    """The class of one process's silence, with the evidence in words.

    Attributes:
        kind: where its training thread was parked, when known.
        source: for ``source_wait``: what it waits on (``network: socket
            127.0.0.1:8080``, ``filesystem: /mnt/data/x``).
        at: for ``work`` seen by a heartbeat: when that heartbeat was sent (the
            observer's clock, seconds); ``None``: the work runs to the window's end.
    """

    pid: int
    role: str
    rank: int | None
    silence: Silence
    why: str
    kind: PlaceKind | None = None
    place: str | None = None
    source: str | None = None
    at: float | None = None

    def to_data(self) -> dict[str, object]:
        data: dict[str, object] = {
            "pid": self.pid,
            "role": self.role,
            "silence": self.silence.value,
            "why": self.why,
        }
        if self.rank is not None:
            data["rank"] = self.rank
        if self.kind is not None:
            data["parked"] = self.kind.value
        if self.place:
            data["place"] = self.place
        if self.source:
            data["source"] = self.source
        return data


@dataclass(frozen=True)
class JobEvidence:
    """The class of the job's silence over one window.

    Attributes:
        silence: the job's class.
        why: the deciding process's evidence, with its pid.
        culprit: that process.
        processes: every process's evidence.
    """

    silence: Silence
    why: str
    culprit: ProcessEvidence | None = None
    processes: tuple[ProcessEvidence, ...] = ()

    @property
    def source(self) -> str | None:
        return self.culprit.source if self.culprit is not None else None

    @property
    def at(self) -> float | None:
        """For ``work``: when it was last seen (the observer's clock, seconds);
        ``None``: at the window's end."""
        return self.culprit.at if self.culprit is not None else None

    def to_data(self) -> dict[str, object]:
        return {
            "silence": self.silence.value,
            "why": self.why,
            "source": self.source,
            "processes": [p.to_data() for p in self.processes],
        }
