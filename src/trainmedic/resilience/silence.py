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
in :mod:`trainmedic.resilience.timeouts`; the evidence types, in
:mod:`trainmedic.resilience.silence_evidence`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from trainmedic.resilience.places import Place, PlaceKind, classify_place, native_op
from trainmedic.resilience.silence_evidence import (
    JobEvidence,
    KernelView,
    ProcessEvidence,
    ProcessWindow,
    Silence,
    StackView,
)

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

    def verdict(
        silence: Silence, why: str, source: str | None = None, at: float | None = None
    ) -> ProcessEvidence:
        return ProcessEvidence(
            window.pid, window.role, window.rank, silence, why, kind, place, source, at
        )

    work = _work(window, s, k, kind)
    if work is not None:
        return verdict(Silence.WORK, work[0], at=work[1])
    where = f" in {place}" if place else (f" in `{k.syscall}`" if k and k.syscall else "")
    if kind in (PlaceKind.PEER, PlaceKind.DEVICE):
        what = "a collective" if kind is PlaceKind.PEER else "a device synchronisation"
        return verdict(Silence.PEER_WAIT, f"waits in {what}{where}")
    if (
        window.rank is not None
        and s is not None
        and in_backward(s.place)
        and not (k is not None and k.on_cpu)
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
) -> tuple[str, float | None] | None:
    """Why the process counts as working and when it was last seen to (``None``:
    the window's end), or ``None``."""
    if s is not None and s.work > 0:
        return f"{s.work} forward/backward/optimizer call(s) or batch(es)", s.work_at
    waiting = kind is not None and kind.waits
    if s is not None and s.novel and not waiting:
        return f"the training thread reached new code ({s.place.describe()})", s.novel_at
    why = _kernel_work(window, s, k, kind, waiting)
    return None if why is None else (why, None)


def _kernel_work(
    window: ProcessWindow,
    s: StackView | None,
    k: KernelView | None,
    kind: PlaceKind | None,
    waiting: bool,
) -> str | None:
    """Work the kernel (or the GPU) shows over the window, or ``None``."""
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
    working = [e for e in counted if e.silence is Silence.WORK]
    if working:
        # The latest work decides: work running to the window's end over work a
        # heartbeat showed earlier.
        latest = max(working, key=lambda e: math.inf if e.at is None else e.at)
        return JobEvidence(Silence.WORK, _who(latest), latest, tuple(evidences))
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
