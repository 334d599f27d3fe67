"""Why a job watched from outside waits: for its data (``input.*``) or on its own loop
(``host.*``), in the run's vocabulary.

The training thread's samples that are not training (:mod:`~trainmedic.attach.parts`)
are named by the probe's classifiers (:mod:`~trainmedic.attach.states`):

* **data**: the DataLoader fetching in this thread, waiting for its workers, or,
  in a loop without one, the loop making batches itself (``transform``,
  ``file_read``, ``socket_wait``) or waiting on threads or processes that make
  them (``ipc_wait``);
* **the loop's own time**: ``sleep``, ``log``, ``sync``, ``file_write``
  (checkpoints), ``python``, ``other``.

Data over ``data_wait_warning_share`` of the thread's samples (the low end of
its interval; ``data_wait_error_share``: error) is one ``input.*`` finding,
named by what the loading work does, read from the stacks of whoever does it
(the training thread itself, the DataLoader's workers, the threads or
processes it waits on): ``input.io`` in file reads, ``input.network`` in
socket reads; computing: ``input.workers`` when the training thread loads
itself or its workers leave cores unused, ``input.cpu`` when they fill the
usable cores, ``input.gil`` when threads of the same process compute in
Python. Without stacks of the loading work, its kernel state (``/proc``)
says file, socket or CPU. Each part of the loop's own time over the same bar
is a ``host.<state>`` finding.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainmedic.attach.observe import Observation, ProcessUse
from trainmedic.attach.parts import MIN_SAMPLES, TrainingThread, part_of
from trainmedic.attach.states import helper_state, loader_state, outside_state, tally
from trainmedic.diagnose.host_time import HOST_KINDS
from trainmedic.diagnose.sampled import wilson_interval
from trainmedic.diagnose.thresholds import DEFAULT_THRESHOLDS, Thresholds
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.sample_states import DATA_STATES

_WORK = {
    "file_read": "file",
    "file": "file",
    "socket_wait": "socket",
    "socket": "socket",
    "transform": "cpu",
    "python": "cpu",
    "native": "cpu",
    "cpu": "cpu",
}
"""A loading state as what the loading work spends itself on."""


@dataclass(frozen=True)
class Loading:
    """Where a training thread's samples that are not training went.

    Attributes:
        in_thread: states of the data work done in the training thread itself.
        worker_wait: samples waiting inside the DataLoader for its workers.
        others_wait: samples waiting on other threads or processes (no DataLoader).
        own: the loop's own time by state (``sleep``, ``log``, ``file_write``...).
    """

    samples: int
    in_thread: Counter[str] = field(default_factory=Counter)
    worker_wait: int = 0
    others_wait: int = 0
    own: Counter[str] = field(default_factory=Counter)

    @property
    def data(self) -> int:
        return sum(self.in_thread.values()) + self.worker_wait + self.others_wait


def loading_of(t: TrainingThread, uses_gpu: bool | None = None) -> Loading:
    """The training thread's non-training samples, named (module docstring)."""
    in_thread: Counter[str] = Counter()
    own: Counter[str] = Counter()
    worker_wait = others_wait = 0
    for stack, n in t.thread.stacks.items():
        part = part_of(stack)
        if part == "data_in_process":
            in_thread[loader_state(stack)] += n
        elif part == "data_wait":
            worker_wait += n
        elif part == "checkpoint":
            own["file_write"] += n
        elif part == "host":
            state = outside_state(stack)
            if state == "ipc_wait":
                others_wait += n
            elif state in DATA_STATES:
                in_thread[state] += n
            else:
                if state == "sync" and uses_gpu is False:
                    state = "python"  # no device to wait for: the values are Python's work
                own[state] += n
    return Loading(t.samples, in_thread, worker_wait, others_wait, own)


def _workers_of(obs: Observation, pid: int) -> list[int]:
    return [p.pid for p in obs.tree.by_role("worker") if p.ppid == pid]


def _work(counts: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for state, n in counts.items():
        if state in _WORK:
            out[_WORK[state]] += n
    return out


def _kernel_work(use: ProcessUse | None) -> str | None:
    """What a process's kernel state says it spends itself on (``None``: nothing)."""
    if use is None:
        return None
    target = use.target or ""
    if use.state == "D" or (use.syscall in ("read", "pread64", "readv") and target.startswith("/")):
        return "file"
    if target.startswith("socket") or use.syscall in ("recvfrom", "recvmsg", "connect"):
        return "socket"
    return "cpu" if (use.cpu_s or 0.0) / max(use.span_s, 1e-9) >= 0.5 else None


def _worker_work(obs: Observation, workers: list[int]) -> Counter[str]:
    stacks = [
        (stack, n)
        for (pid, tid), ts in obs.sampling.threads.items()
        if pid in workers and tid == pid
        for stack, n in ts.stacks.items()
    ]
    work = _work(tally(stacks, loader_state))
    if not work:
        for pid in workers:
            kind = _kernel_work(obs.use.get(pid))
            if kind is not None:
                work[kind] += 1
    return work


def _helper_work(obs: Observation, t: TrainingThread) -> tuple[Counter[str], Counter[str]]:
    """What the other threads of the training process, and its child processes, do
    while it waits on them: (threads', processes')."""
    children = set(_workers_of(obs, t.process.pid))
    threads: list[tuple[Any, int]] = []
    processes: list[tuple[Any, int]] = []
    for (pid, tid), ts in obs.sampling.threads.items():
        if pid == t.process.pid and tid != t.thread.tid:
            threads.extend(ts.stacks.items())
        elif pid in children:
            processes.extend(ts.stacks.items())
    return _work(tally(threads, helper_state)), _work(tally(processes, helper_state))


def _interval(hits: int, n: int, th: Thresholds) -> tuple[float, float]:
    return wilson_interval(hits, n, th.share_z)


def input_finding(
    obs: Observation,
    t: TrainingThread,
    th: Thresholds = DEFAULT_THRESHOLDS,
    loading: Loading | None = None,
) -> Finding | None:
    """The training thread waits for data: why, from whoever loads it (module docstring)."""
    lo = loading or loading_of(t)
    n, hits = t.samples, lo.data
    low, high = _interval(hits, n, th)
    if n < MIN_SAMPLES or low < th.data_wait_warning_share:
        return None
    share = hits / n
    severity = Severity.ERROR if low >= th.data_wait_error_share else Severity.WARNING
    workers = _workers_of(obs, t.process.pid)
    cores = obs.usable_cores
    spans = [obs.use[w] for w in workers if w in obs.use]
    worker_cores = sum((u.cpu_s or 0.0) for u in spans) / obs.seconds if spans else 0.0
    in_thread = sum(lo.in_thread.values())
    where = "self"
    work = _work(lo.in_thread)
    if workers and lo.worker_wait > max(in_thread, lo.others_wait):
        where, work = "workers", _worker_work(obs, workers)
    elif lo.others_wait > in_thread:
        threads, processes = _helper_work(obs, t)
        where = "threads" if sum(threads.values()) >= sum(processes.values()) else "processes"
        work = threads if where == "threads" else processes
        if not work and workers:
            work = _worker_work(obs, workers)
    kind = work.most_common(1)[0][0] if work else "cpu"
    evidence: dict[str, Any] = {
        "data_share": round(share, 4),
        "data_share_interval": [round(low, 4), round(high, 4)],
        "samples": n,
        "in_training_thread_share": round(in_thread / n, 4),
        "waits_for_workers_share": round(lo.worker_wait / n, 4),
        "waits_on_others_share": round(lo.others_wait / n, 4),
        "loading_work": dict(work),
        "loaded_by": where,
        "workers": len(workers),
        "workers_cpu_cores": round(worker_cores, 3),
        "usable_cores": cores,
        "window_s": round(obs.seconds, 1),
    }
    what = f"The training thread spends {share:.0%} of its time on data"
    by = {
        "self": "loading its batches itself",
        "workers": f"its {len(workers)} DataLoader workers",
        "threads": "the threads it hands the loading to",
        "processes": f"the {len(workers)} processes it hands the loading to",
    }[where]

    def found(id_: str, category: Category, title: str, fix: str) -> Finding:
        return Finding(
            id=id_, category=category, severity=severity, title=title, evidence=evidence,
            fix=fix, impact=share, subject=f"pid {t.process.pid}",
        )  # fmt: skip

    if kind == "file":
        return found(
            "input.io", Category.IO, f"{what}: {by} wait in file reads",
            "Read from faster storage (a local SSD copy), larger files, or keep more reads "
            "in flight (more DataLoader workers, or threads inside each).",
        )  # fmt: skip
    if kind == "socket":
        return found(
            "input.network", Category.NETWORK, f"{what}: {by} wait in network reads",
            "Keep more reads in flight (more workers, or threads inside each), and cache "
            "the data near the GPU.",
        )  # fmt: skip
    advice = max(1, min(cores - 1, 8))
    if where == "self":
        return found(
            "input.workers", Category.FRAMEWORK_CONFIG,
            f"{what}, loading its batches itself (no DataLoader workers)",
            f"Load in worker processes: DataLoader(..., num_workers={advice}, "
            "persistent_workers=True, pin_memory=True); 'trainmedic run' of the same job "
            "measures the count it needs.",
        )  # fmt: skip
    if where == "threads":
        return found(
            "input.gil", Category.FRAMEWORK_CONFIG,
            f"{what}: the threads that make its batches compute in Python, one at a time "
            "(the interpreter lock)",
            f"Make the batches in processes: ProcessPoolExecutor({advice}), or a Dataset "
            f"with DataLoader(num_workers={advice}).",
        )  # fmt: skip
    if worker_cores >= 0.8 * max(1, cores - 1):
        return found(
            "input.cpu", Category.CPU,
            f"{what}: {by} use {worker_cores:.1f} of the {cores} usable cores",
            "The cores are full: make the transforms cheaper (decode at lower resolution, "
            "move augmentations to the GPU), cache decoded samples, or run on a machine "
            "with more cores.",
        )  # fmt: skip
    more = max(min(cores - 1, max(len(workers) * 2, len(workers) + 1)), len(workers) + 1)
    return found(
        "input.workers", Category.FRAMEWORK_CONFIG,
        f"{what}: {by} use only {worker_cores:.1f} of {cores} usable cores",
        f"Use more of them: DataLoader(..., num_workers={more}) (or as many producers).",
    )  # fmt: skip


def host_findings(
    obs: Observation,
    t: TrainingThread,
    th: Thresholds = DEFAULT_THRESHOLDS,
    loading: Loading | None = None,
) -> list[Finding]:
    """One ``host.<state>`` finding for each part of the loop's own time over the bar."""
    lo = loading or loading_of(t)
    n = t.samples
    if n < MIN_SAMPLES:
        return []
    out = []
    for state, hits in lo.own.most_common():
        low, high = _interval(hits, n, th)
        if low < th.data_wait_warning_share:
            continue
        kind = HOST_KINDS.get(state, HOST_KINDS["other"])
        share = hits / n
        out.append(
            Finding(
                id=f"host.{state}" if state in HOST_KINDS else "host.other",
                category=kind.category,
                severity=Severity.ERROR if low >= th.data_wait_error_share else Severity.WARNING,
                title=f"{share:.0%} of the training thread's time goes outside training: "
                f"{kind.what}",
                evidence={
                    "outside_share": round(share, 4),
                    "outside_share_interval": [round(low, 4), round(high, 4)],
                    "samples": n,
                    "outside_states": dict(lo.own),
                    "window_s": round(obs.seconds, 1),
                },
                fix=kind.fix,
                impact=share,
                subject=f"pid {t.process.pid}",
            )
        )
    return out
