"""A bounded window on a running job: py-spy's samples joined to what ``/proc`` shows.

:func:`observe` finds the job (:mod:`~trainmedic.attach.tree`), reads every
process's and thread's counters, samples every thread's stack for the window
(:mod:`~trainmedic.attach.spy`) and reads the counters again: CPU time,
run-queue wait (``schedstat``), bytes read and written, the main thread's
state and system call. Nothing is sent to the job: no signal, no pause, no
code. The judgment is :mod:`~trainmedic.attach.judge`'s.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.attach.access import read_problem
from trainmedic.attach.gpus import GpuWatch, GpuWindow
from trainmedic.attach.spy import DEFAULT_RATE, Sampling, ThreadSamples, record
from trainmedic.attach.tree import JobTree, find_job
from trainmedic.errors import InputError
from trainmedic.gpu.backend import GpuBackend, NoGpuBackend
from trainmedic.host.schedstat import TaskTimes, read_tasks
from trainmedic.supervise.observe.procview import (
    ProcSnapshot,
    fd_target,
    read_process,
    socket_peers,
)


@dataclass(frozen=True)
class ThreadUse:
    """One thread over the window, seconds: on a CPU, and runnable waiting for one."""

    cpu_s: float
    run_wait_s: float


@dataclass(frozen=True)
class ProcessUse:
    """One process over the window (counters are the window's deltas).

    Attributes:
        span_s: seconds between the two readings.
        cpu_s: CPU seconds of all its threads.
        io_bytes: bytes read and written (``rchar + wchar``).
        state / syscall / target: its main thread's at the end (``target``: what the
            call works on, a path, ``socket 10.0.0.5:9000``, ``pipe``).
        threads: by thread id, from ``schedstat``.
        peers: the remote ends of its TCP connections (a few).
    """

    pid: int
    span_s: float
    cpu_s: float | None
    io_bytes: int | None
    dirtied_bytes: int | None
    run_wait_s: float | None
    wakeups: int | None
    state: str | None
    syscall: str | None
    target: str | None
    threads: dict[int, ThreadUse] = field(default_factory=dict)
    peers: tuple[str, ...] = ()


NO_GPUS = GpuWindow("none", "not read")


@dataclass(frozen=True)
class Observation:
    """Everything the window saw.

    Attributes:
        access: why memory could not be read (``None``: it could); the stacks are then empty.
        gone: processes of the job that ended during the window.
        usable_cores: CPUs this machine lets the job use.
        gpu: the GPUs' readings over the window, and which the job uses.
    """

    tree: JobTree
    sampling: Sampling
    use: dict[int, ProcessUse]
    seconds: float
    access: str | None
    gone: tuple[int, ...]
    usable_cores: int
    gpu: GpuWindow = NO_GPUS


def _delta(a: float | int | None, b: float | int | None) -> float | None:
    return None if a is None or b is None else max(0.0, float(b) - float(a))


def _use(
    pid: int,
    before: ProcSnapshot,
    after: ProcSnapshot,
    span: float,
    t0: dict[int, TaskTimes],
    t1: dict[int, TaskTimes],
) -> ProcessUse:
    threads = {
        tid: ThreadUse(
            max(0, t.run_ns - t0[tid].run_ns) / 1e9, max(0, t.wait_ns - t0[tid].wait_ns) / 1e9
        )
        for tid, t in t1.items()
        if tid in t0
    }
    target = None
    if after.fd is not None:
        target, _ = fd_target(pid, after.fd)
    io = _delta(before.io_chars, after.io_chars)
    dirtied = _delta(before.dirtied_bytes, after.dirtied_bytes)
    wakeups = _delta(before.wakeups, after.wakeups)
    return ProcessUse(
        pid=pid,
        span_s=span,
        cpu_s=_delta(before.cpu_s, after.cpu_s),
        io_bytes=int(io) if io is not None else None,
        dirtied_bytes=int(dirtied) if dirtied is not None else None,
        run_wait_s=_delta(before.run_wait_s, after.run_wait_s),
        wakeups=int(wakeups) if wakeups is not None else None,
        state=after.state,
        syscall=after.syscall,
        target=target,
        threads=threads,
        peers=tuple(socket_peers(pid)),
    )


def _merged(parts: list[Sampling], seconds: int, rate: int, problem: str | None) -> Sampling:
    """One sampling of several py-spy runs (one per topmost Python process)."""
    if not parts:
        return Sampling({}, {}, seconds, rate, problem=problem)
    threads: dict[tuple[int, int], ThreadSamples] = {}
    commands: dict[int, str] = {}
    for part in parts:
        threads.update(part.threads)
        commands.update(part.commands)
    counts = [p.samples for p in parts if p.samples is not None]
    errors = [p.errors for p in parts if p.errors is not None]
    problems = [p.problem for p in parts if p.problem]
    cpu = [p.sampler_cpu_s for p in parts if p.sampler_cpu_s is not None]
    return Sampling(
        threads,
        commands,
        seconds,
        rate,
        samples=sum(counts) if counts else None,
        errors=sum(errors) if errors else None,
        problem=problem or (problems[0] if problems and not threads else None),
        sampler_cpu_s=sum(cpu) if cpu else None,
    )


def observe(
    pid: int,
    seconds: int,
    workdir: Path,
    rate: int = DEFAULT_RATE,
    on_progress: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    gpus: GpuBackend | None = None,
) -> Observation:
    """Watch the job at ``pid`` for ``seconds``; ``on_progress`` gets the seconds elapsed;
    ``gpus`` is read throughout (``None``: no GPU readings).

    Raises:
        InputError: ``pid`` names no job to attach to (:func:`~trainmedic.attach.tree.find_job`).
    """
    tree = find_job(pid)
    if not any(p.python for p in tree.processes):
        root = tree.get(pid)
        command = " ".join(root.argv[:3]) if root is not None and root.argv else "?"
        raise InputError(f"process {pid} ({command}) runs no Python, and none below it does")
    problem = read_problem(pid)
    watch = GpuWatch(gpus or NoGpuBackend("not read")).start()
    start = clock()
    before = {p.pid: (read_process(p.pid), read_tasks(p.pid)) for p in tree.processes}
    # One sampler for each training process, following its workers (py-spy follows
    # neither a shell's children nor the ranks torchrun's agent starts); without a
    # training process, one for each topmost Python process.
    python = {p.pid for p in tree.processes if p.python}
    targets = [p.pid for p in tree.by_role("training")] or [
        p.pid for p in tree.processes if p.python and p.ppid not in python
    ]
    results: dict[int, Sampling] = {}
    samplers = []
    if problem is None:
        for target in targets:
            out = workdir / f"py-spy-{target}.txt"
            thread = threading.Thread(
                target=lambda t=target, o=out: results.__setitem__(t, record(t, seconds, o, rate)),
                name="trainmedic-attach-spy",
                daemon=True,
            )
            thread.start()
            samplers.append(thread)
    while True:
        elapsed = clock() - start
        if on_progress is not None:
            on_progress(min(elapsed, float(seconds)))
        if samplers and not any(t.is_alive() for t in samplers):
            break
        if not samplers and elapsed >= seconds:
            break
        time.sleep(0.2)
    span = clock() - start
    gpu = watch.stop(p.pid for p in tree.processes)
    sampling = _merged(
        list(results.values()),
        seconds,
        rate,
        problem or (None if targets else "no Python process in the job"),
    )
    use: dict[int, ProcessUse] = {}
    gone: list[int] = []
    for p in tree.processes:
        snap0, tasks0 = before[p.pid]
        snap1 = read_process(p.pid)
        if snap0 is None or snap1 is None:
            gone.append(p.pid)
            continue
        use[p.pid] = _use(p.pid, snap0, snap1, span, tasks0, read_tasks(p.pid))
    return Observation(
        tree, sampling, use, span, problem, tuple(gone), len(os.sched_getaffinity(0)), gpu
    )
