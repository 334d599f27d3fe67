"""What a silence is: the job's processes, classified by evidence.

Between two steps the job is *silent*; the watchdog must tell a job that
works through the silence (an unmarked evaluation, a large checkpoint write,
one long native call) from one that hangs. Every fraction of a second it
gathers, for each process of the job, a :class:`ProcessWindow` — the
kernel's view of the last second (:class:`KernelView`: CPU time, bytes read
and written, files growing, the thread's state and system call, storage
flushing) and the probe's (:class:`StackView`: where the training thread is
parked, whether it moved, whether Python code is running, the count of
forward/backward/optimizer calls and batches) — and these pure functions
classify it:

* ``work``: forward/backward/optimizer calls or batches counted; the
  training thread reached new code; bytes read or written by the thread's own
  I/O, or a socket read that keeps returning (socket bytes never show in the
  kernel's per-process counters; the thread's wake-ups do); files open for
  writing grow, or pages are dirtied, by a megabyte or more; storage flushes
  while the thread waits in ``fsync``/``write``; CPU time advancing while the
  thread is parked in a native compute or I/O call (a torch op,
  ``torch.save``, compression); GPU activity while it waits on nothing;
* ``blocked``: off-CPU, nothing moving, parked in a sleep, a lock, a
  condition, a queue, a join;
* ``spinning``: CPU advancing while the thread runs Python in place, calling no work;
* ``peer_wait``: parked in a collective or a device synchronisation, whatever
  CPU and GPU do (NCCL kernels spin);
* ``source_wait``: parked in a socket or file read with nothing arriving: the
  data store or the filesystem;
* ``unclear``: the evidence cannot tell: CPU busy with no stack to look at,
  the probe's heartbeats late while the process waits for a CPU.

The job (:func:`classify_job`) works when any of its processes works (a
rank evaluating while the others wait in a barrier; DataLoader workers
fetching slow remote samples while the trainer waits for them); it is
unclear when any process is unclear; otherwise it is silent for the reason
of its culprit: a stalled source first, then a spinning or blocked process,
then ranks waiting on peers. In a distributed job the culprit is always a
rank (or one of its DataLoader workers), never the launcher's agent, which
sleeps in its monitor loop all along; a rank whose backward waits off the CPU
is waiting in the gradient all-reduce (DDP's reducer waits in C++, where no
collective shows on the Python stack). Processes the probe does not see (a sidecar
such as a metrics uploader) count only when no probed process exists or one
of them waits for a child program. The bounds that apply to each class are
in :mod:`trainmedic.resilience.timeouts`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from trainmedic.resilience.places import Place, PlaceKind, classify_place, native_op

ON_CPU_SHARE = 0.2
"""A process using at least this share of one core is on the CPU (the probe's
own thread, a few milliseconds a second, never reaches it)."""
GIL_BUSY_SHARE = 0.5
"""At least this share of the probe's samples found Python code running."""
STARVED_SHARE = 0.3
"""Waiting this share of the window for a CPU is starvation."""
BIG_WRITE_BYTES = 1024 * 1024
"""File growth or dirtied pages that count as work whatever the thread waits on
(another thread writing a checkpoint); a log line does not reach it."""
PYTHON_IO_BYTES = 64 * 1024
"""Bytes a thread running Python must move in a window to count as I/O work
(reading a file line by line does; a loop printing a status line does not)."""
MIB = 1024 * 1024
SPIN_PLACES = 3
"""A thread running Python through more places than this may be working."""
LATE_S = 1.0
"""A heartbeat this long in transit says the supervisor falls behind."""


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
    """

    place: Place
    fresh: bool = True
    samples: int = 0
    gil_busy: int = 0
    work: int = 0
    novel: bool = False
    lag_s: float | None = None
    places: int = 1

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
    """

    pid: int
    role: str
    rank: int | None
    silence: Silence
    why: str
    kind: PlaceKind | None = None
    place: str | None = None
    source: str | None = None

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

    def to_data(self) -> dict[str, object]:
        return {
            "silence": self.silence.value,
            "why": self.why,
            "source": self.source,
            "processes": [p.to_data() for p in self.processes],
        }


# --- one process -------------------------------------------------------------------------------

_KERNEL_WAITS = {
    "nanosleep": PlaceKind.SLEEP,
    "clock_nanosleep": PlaceKind.SLEEP,
    "pause": PlaceKind.SLEEP,
    "futex": PlaceKind.LOCK,
    "poll": PlaceKind.LOCK,
    "ppoll": PlaceKind.LOCK,
    "select": PlaceKind.LOCK,
    "pselect6": PlaceKind.LOCK,
    "epoll_wait": PlaceKind.LOCK,
    "epoll_pwait": PlaceKind.LOCK,
    "epoll_pwait2": PlaceKind.LOCK,
    "wait4": PlaceKind.CHILD,
    "waitid": PlaceKind.CHILD,
    "read": PlaceKind.FILE,
    "pread64": PlaceKind.FILE,
    "readv": PlaceKind.FILE,
    "recvfrom": PlaceKind.SOCKET,
    "recvmsg": PlaceKind.SOCKET,
    "accept": PlaceKind.SOCKET,
    "accept4": PlaceKind.SOCKET,
    "connect": PlaceKind.SOCKET,
    "write": PlaceKind.FILE,
    "pwrite64": PlaceKind.FILE,
    "writev": PlaceKind.FILE,
    "fsync": PlaceKind.FILE,
    "fdatasync": PlaceKind.FILE,
    "sync_file_range": PlaceKind.FILE,
    "close": PlaceKind.FILE,
}


def kernel_kind(kernel: KernelView) -> PlaceKind | None:
    """Where the main thread waits, from its system call alone (no probe, or a
    probe that cannot run): a read on a socket is network I/O, on a pipe a wait
    on another process of the job."""
    kind = _KERNEL_WAITS.get(kernel.syscall or "")
    target = kernel.target or ""
    if kind is PlaceKind.FILE and target.startswith("socket"):
        return PlaceKind.SOCKET
    if kind is PlaceKind.FILE and target.startswith(("pipe", "anon_inode")):
        return PlaceKind.LOCK
    return kind


def classify_process(window: ProcessWindow) -> ProcessEvidence:
    """The class of one process's silence over the window (module docstring)."""
    k = window.kernel
    s = window.stack if window.stack is not None and window.stack.fresh else None
    kind = classify_place(s.place) if s is not None else None
    if kind in (None, PlaceKind.UNKNOWN) and k is not None:
        kind = kernel_kind(k) or kind
    if s is not None and kind is PlaceKind.COMPUTE and _python_spin(s):
        kind = PlaceKind.PYTHON
    place = s.place.describe() if s is not None else None

    def verdict(silence: Silence, why: str, source: str | None = None) -> ProcessEvidence:
        return ProcessEvidence(
            window.pid, window.role, window.rank, silence, why, kind, place, source
        )

    work = _work(window, s, k, kind)
    if work is not None:
        return verdict(Silence.WORK, work)
    where = f" in {place}" if place else (f" in `{k.syscall}`" if k and k.syscall else "")
    if kind in (PlaceKind.PEER, PlaceKind.DEVICE):
        what = "a collective" if kind is PlaceKind.PEER else "a device synchronisation"
        return verdict(Silence.PEER_WAIT, f"waits in {what}{where}")
    if window.rank is not None and s is not None and in_backward(s.place) and not (
        k is not None and k.on_cpu
    ):
        # A rank's backward off the CPU with nothing counted is DDP's (or FSDP's)
        # gradient reduction waiting for the other ranks: the reducer waits in C++,
        # so no collective shows on the Python stack.
        return verdict(
            Silence.PEER_WAIT, f"waits in the gradient all-reduce inside backward{where}"
        )
    if k is None:
        return verdict(Silence.UNCLEAR, "its CPU and I/O cannot be read")
    late = window.stack is not None and s is None
    if late and (window.stack.lag_s or 0.0) >= LATE_S:  # type: ignore[union-attr]
        lag = window.stack.lag_s  # type: ignore[union-attr]
        return verdict(
            Silence.UNCLEAR,
            f"its heartbeats take {lag:.1f} s to arrive: the supervisor is short of CPU",
        )
    if k.starved and late:
        return verdict(Silence.UNCLEAR, "waits for a CPU; its heartbeats are late")
    if kind in (PlaceKind.SOCKET, PlaceKind.FILE):
        return _source_wait(verdict, k, kind, where)
    if kind is PlaceKind.PYTHON and s is not None and (k.on_cpu or s.python_running):
        if s.places > SPIN_PLACES:
            # Long pure-Python work (a metric over a corpus) also calls no library;
            # a spin-wait circles one to three places.
            return verdict(
                Silence.UNCLEAR,
                f"runs Python through {s.places} places{where}, calling no library",
            )
        # The interpreter lock shows Python running even when a loaded machine
        # gives the loop little CPU.
        return verdict(
            Silence.SPINNING,
            f"runs Python in place{where} on {_cores(k)} of CPU, calling no work",
        )
    if k.on_cpu:
        return verdict(
            Silence.UNCLEAR, f"uses {_cores(k)} of CPU{where or ' with no stack to read'}"
        )
    if kind is not None and kind.waits:
        # A sleeping loop is runnable for an instant each time it wakes: its stack
        # says what it does between those instants.
        return verdict(Silence.BLOCKED, f"off the CPU, nothing moving{where}")
    if k.state == "R" or (k.state is None and kind is None):
        return verdict(Silence.UNCLEAR, "runnable but not running")
    if k.state == "D":
        return _source_wait(verdict, k, PlaceKind.FILE, where)
    return verdict(Silence.BLOCKED, f"off the CPU, nothing moving{where}")


_BACKWARD_FRAMES = ("_engine_run_backward", "run_backward")


def in_backward(place: Place) -> bool:
    """The thread is inside autograd's backward (``loss.backward()``), whose native
    engine holds it: the innermost frame is autograd's entry into the engine."""
    if place.calls and place.calls[-1] == "run_backward":
        return True
    inner = place.modules[0] if place.modules else ""
    return inner.startswith("torch.autograd") and place.where.endswith(_BACKWARD_FRAMES)


def _python_spin(s: StackView) -> bool:
    """Parked at a call of unknown nature while Python keeps running: a loop calling
    a builtin (3.12+ lets other threads in after each call), not a native op."""
    place = s.place
    root = place.calls[0] if place.calls else ""
    module = place.modules[0] if place.modules else ""
    certain = root in ("torch", "np", "numpy", "scipy", "F") or module.startswith(
        ("torch", "numpy", "scipy")
    )
    return s.python_running and not certain and not native_op(place)


def _work(
    window: ProcessWindow, s: StackView | None, k: KernelView | None, kind: PlaceKind | None
) -> str | None:
    """Why the process counts as working, or ``None``."""
    if s is not None and s.work > 0:
        return f"{s.work} forward/backward/optimizer call(s) or batch(es)"
    waiting = kind is not None and kind.waits
    if s is not None and s.novel and not waiting:
        return f"the training thread reached new code ({s.place.describe()})"
    if k is None:
        return None
    if (k.growth_bytes or 0) >= BIG_WRITE_BYTES:
        return f"files open for writing grew by {k.growth_bytes / MIB:.1f} MiB"  # type: ignore[operator]
    if (k.dirtied_bytes or 0) >= BIG_WRITE_BYTES:
        return f"wrote {k.dirtied_bytes / MIB:.1f} MiB"  # type: ignore[operator]
    least = PYTHON_IO_BYTES if kind is PlaceKind.PYTHON else 1
    if (k.io_bytes or 0) >= least and not waiting:
        # Bytes moved by the thread's own I/O (a slow remote sample arriving). While
        # it sleeps or waits, other threads' chatter (a log line) is no work of it.
        return f"read or wrote {k.io_bytes} bytes" + (f" ({k.target})" if k.target else "")
    if kind is not None and kind.io and (k.wakeups or 0) > 0 and k.state != "D":
        # Sockets' bytes never show in rchar/wchar: a read that keeps returning does.
        return f"its I/O keeps returning ({k.wakeups} wake-ups" + (
            f", {k.target})" if k.target else ")"
        )
    if kind is PlaceKind.FILE and k.state == "D" and (k.flushed_bytes or 0) > 0:
        return f"storage is flushing its writes ({k.flushed_bytes / MIB:.1f} MiB in the window)"  # type: ignore[operator]
    if k.on_cpu and kind in (PlaceKind.COMPUTE, PlaceKind.FILE):
        what = "a native compute" if kind is PlaceKind.COMPUTE else "an I/O"
        where = f" ({s.place.describe()})" if s is not None else ""
        return f"{_cores(k)} of CPU inside {what} call{where}"
    if window.gpu_busy and not waiting:
        return "its GPU is busy"
    return None


def _source_wait(
    verdict: Callable[..., ProcessEvidence], k: KernelView, kind: PlaceKind, where: str
) -> ProcessEvidence:
    if k.on_cpu:
        return verdict(Silence.UNCLEAR, f"uses {_cores(k)} of CPU in I/O{where} moving no bytes")
    if kind is PlaceKind.SOCKET or (k.target or "").startswith("socket"):
        source = "network" + (f": {k.target}" if k.target else "")
        what = "a network read"
    else:
        source = "filesystem" + (f": {k.target}" if k.target else "")
        what = "file I/O"
    return verdict(
        Silence.SOURCE_WAIT, f"waits in {what}{where} with nothing arriving", source=source
    )


def _cores(k: KernelView) -> str:
    share = k.cpu_share or 0.0
    return f"{share:.1f} core" + ("s" if round(share, 1) != 1.0 else "")


# --- the job -------------------------------------------------------------------------------------

_CULPRIT_ORDER = (Silence.SOURCE_WAIT, Silence.SPINNING, Silence.BLOCKED, Silence.PEER_WAIT)


def classify_job(windows: Sequence[ProcessWindow]) -> JobEvidence:
    """The class of the job's silence: work if any process works, unclear if any
    is unclear, else the culprit's class (module docstring)."""
    probed = [w for w in windows if w.probed]
    evidences = [classify_process(w) for w in windows]
    waits_on_child = any(e.kind is PlaceKind.CHILD for e in evidences if e.pid in _pids(probed))
    counted = [
        e for e, w in zip(evidences, windows, strict=True)
        if w.probed or not probed or waits_on_child
    ]  # fmt: skip
    if not counted:
        return JobEvidence(Silence.UNCLEAR, "no process of the job could be observed")
    ranked = [e for e in counted if e.rank is not None]
    for e in counted:
        if e.silence is Silence.WORK:
            return JobEvidence(Silence.WORK, _who(e), e, tuple(evidences))
    for e in counted:
        if e.silence is Silence.UNCLEAR:
            return JobEvidence(Silence.UNCLEAR, _who(e), e, tuple(evidences))
    # In a distributed job the culprit is a rank (or a DataLoader worker of one):
    # the launcher's agent (torchrun) sleeps in its monitor loop all along.
    culprit = min(
        ranked or counted,
        key=lambda e: (
            _CULPRIT_ORDER.index(e.silence),
            # A process waiting on the job itself (a trainer waiting for its workers)
            # explains less than one waiting on anything else.
            e.kind is PlaceKind.LOCK,
            e.role == "worker",
        ),
    )
    return JobEvidence(culprit.silence, _who(culprit), culprit, tuple(evidences))


def _pids(windows: Sequence[ProcessWindow]) -> set[int]:
    return {w.pid for w in windows}


def _who(e: ProcessEvidence) -> str:
    name = e.role if e.role not in ("unknown", "process", "forked") else "process"
    if e.rank is not None:
        name = f"rank {e.rank}"
    return f"{name} {e.pid} {e.why}"
