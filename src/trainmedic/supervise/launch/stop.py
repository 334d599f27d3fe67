"""Stop a job completely: SIGTERM, a grace period, SIGKILL, and nothing left behind.

:func:`stop_job` acts on the whole job, not only its leader:

1. The job's tree is captured first (psutil objects of the leader's
   descendants and of the processes re-parented to trainmedic, the child
   subreaper), because a leader that dies first orphans its children.
2. SIGTERM goes to the job's process group, and to every captured process
   that left the group (``setsid``, ``setpgid``): DataLoader workers stay in
   the group, daemons and some launchers do not.
3. Whatever still runs after ``grace_s`` gets SIGKILL, group and stragglers.
4. Children spawned during the grace period are swept in further rounds,
   and the result says which pids, if any, survived (none should: SIGKILL
   cannot be caught).
5. With a GPU backend, the call waits (bounded) until no GPU lists a process
   of the job any more: a new attempt that starts while the old one's memory
   is still held can run out of memory for no reason of its own.

The leader is waited on through its ``Popen`` only: psutil would reap it
behind ``Popen``'s back and its return code would be lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainmedic.host import ps
from trainmedic.supervise.launch.launcher import Job, is_alive

SWEEP_ROUNDS = 3
"""Rounds of kill-and-check for processes spawned while the job was stopping."""
KILL_WAIT_S = 2.0
"""How long SIGKILLed processes may take to disappear, seconds."""


@dataclass(frozen=True)
class StopReport:
    """What stopping the job took.

    Attributes:
        pids: every process of the job that was running when the stop began
            (and those found while stopping).
        terminated: pids that ended within the grace period.
        killed: pids that needed SIGKILL.
        survivors: pids still running at the end (should be empty).
        took_s: seconds from the first signal to the last process gone.
        gpu_released: whether no GPU lists a job process any more (``None``:
            not checked, no GPU backend).
        gpu_wait_s: seconds spent waiting for GPU memory release.
    """

    pids: tuple[int, ...]
    terminated: tuple[int, ...]
    killed: tuple[int, ...]
    survivors: tuple[int, ...]
    took_s: float
    gpu_released: bool | None = None
    gpu_wait_s: float = 0.0


GpuPids = Callable[[], set[int] | None]
"""Pids the GPUs list right now; ``None`` when unknown (no backend, a read failed)."""


def stop_job(
    job: Job,
    grace_s: float,
    *,
    first_signal: int = signal.SIGTERM,
    gpu_pids: GpuPids | None = None,
    gpu_wait_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StopReport:
    """Stop ``job`` and every process it started (see the module docstring)."""
    t0 = clock()
    # The leader is left to Popen: psutil would reap it and lose its return code.
    tree = {p.pid: p for p in job.descendants() if p.pid != job.pid}
    all_pids = set(tree) | {job.pid}
    _signal_all(job, tree.values(), first_signal)
    deadline = t0 + grace_s
    while clock() < deadline:
        if job.poll() is not None and not _alive(tree.values(), job.pid):
            break
        sleep(min(0.05, max(0.0, deadline - clock())))
    killed: set[int] = set()
    for _ in range(SWEEP_ROUNDS):
        # Children started during the grace period are part of the job too.
        for p in job.descendants():
            if p.pid not in tree and p.pid != job.pid:
                tree[p.pid] = p
                all_pids.add(p.pid)
        remaining = [p for p in tree.values() if is_alive(p)]
        leader_running = job.poll() is None
        if not remaining and not leader_running:
            break
        killed |= {p.pid for p in remaining}
        if leader_running:
            killed.add(job.pid)
        _signal_all(job, remaining, signal.SIGKILL)
        ps.wait_procs(remaining, timeout=KILL_WAIT_S)
        job.wait(KILL_WAIT_S)
    survivors = sorted(p.pid for p in tree.values() if is_alive(p))
    if job.poll() is None:
        survivors.append(job.pid)
    took = clock() - t0
    terminated = sorted(all_pids - killed - set(survivors))
    released, waited = None, 0.0
    if gpu_pids is not None:
        released, waited = wait_gpu_release(all_pids, gpu_pids, gpu_wait_s, clock, sleep)
    return StopReport(
        pids=tuple(sorted(all_pids)),
        terminated=tuple(terminated),
        killed=tuple(sorted(killed)),
        survivors=tuple(survivors),
        took_s=took,
        gpu_released=released,
        gpu_wait_s=waited,
    )


def wait_gpu_release(
    pids: Iterable[int],
    gpu_pids: GpuPids,
    limit_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    period_s: float = 0.5,
) -> tuple[bool | None, float]:
    """Wait until no GPU lists any of ``pids``; (released, seconds waited).

    ``released`` is ``None`` when the GPUs' process lists cannot be read at
    all, ``False`` when ``limit_s`` passed with a process still listed.
    """
    wanted = set(pids)
    t0 = clock()
    while True:
        listed = gpu_pids()
        if listed is None:
            return None, clock() - t0
        if not listed & wanted:
            return True, clock() - t0
        if clock() - t0 >= limit_s:
            return False, clock() - t0
        sleep(period_s)


def _signal_all(job: Job, procs: Iterable[ps.Process], sig: int) -> None:
    job.signal_group(sig)
    # A job that called setsid() left the group; only then is it sent one directly.
    with contextlib.suppress(OSError):
        if os.getpgid(job.pid) != job.pgid:
            os.kill(job.pid, sig)
    for p in procs:
        # Those in the group already got it; a second delivery is harmless,
        # but a process that left the group gets it only this way.
        with contextlib.suppress(ps.Error, OSError):
            if p.pid != job.pid:
                p.send_signal(sig)


def _alive(procs: Iterable[ps.Process], leader: int) -> bool:
    return any(is_alive(p) for p in procs if p.pid != leader)


def caught_signals(pid: int) -> set[int] | None:
    """Signals ``pid`` has a handler for (``SigCgt`` of ``/proc/<pid>/status``);
    ``None`` where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    mask = int(line.split(":", 1)[1].strip(), 16)
                    return {n + 1 for n in range(mask.bit_length()) if mask >> n & 1}
    except (OSError, ValueError):
        return None
    return None
