"""The findings of a job watched from outside (``trainmedic attach``), most important first.

Each rule reads the :class:`~trainmedic.attach.observe.Observation` and each
training process's training thread (:mod:`~trainmedic.attach.parts`):

* stuck: :mod:`~trainmedic.attach.stuck` (``failure.hang``); when it holds,
  nothing else is said;
* data and the loop's own time: :mod:`~trainmedic.attach.loading`
  (``input.*``, ``host.*``);
* contention: the training thread waited for a CPU (``schedstat``) a share of the
  window (``contention.cpu``);
* the GPUs: the run's own rules over the window's GPU readings and the machine's
  facts (hardware faults, throttling, other tenants on the job's GPUs);
* otherwise ``run.healthy``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from trainmedic.attach.loading import host_findings, input_finding, loading_of
from trainmedic.attach.observe import Observation
from trainmedic.attach.parts import MIN_SAMPLES, TRAINING_PARTS, TrainingThread, training_threads
from trainmedic.attach.stuck import stuck
from trainmedic.diagnose.contention import RESERVE_CORES, gpu_contention
from trainmedic.diagnose.hardware import hardware_faults
from trainmedic.diagnose.thermal import throttling
from trainmedic.diagnose.thresholds import DEFAULT_THRESHOLDS, Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity, rank_findings
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent, RunMeta, RunRecord

GPU_RULES = (hardware_faults, throttling, gpu_contention)
"""The run's rules that need GPU readings and no steps."""


def contention(
    obs: Observation, pid: int, tid: int, th: Thresholds = DEFAULT_THRESHOLDS
) -> Finding | None:
    """The training thread waited for a CPU a share of the window (``schedstat``).

    The sampler's own CPU (py-spy's, measured) is the most of that wait attach can have
    caused: it is taken off before the wait is judged, so that a machine with no core to
    spare is not blamed for attach's own sampling."""
    use = obs.use.get(pid)
    thread = use.threads.get(tid) if use is not None else None
    if thread is None or obs.seconds <= 0:
        return None
    wait = thread.run_wait_s / obs.seconds
    own = (obs.sampling.sampler_cpu_s or 0.0) / obs.seconds
    others = wait - own
    if others < th.cpu_wait_warning_share:
        return None
    severity = Severity.ERROR if others >= th.cpu_wait_error_share else Severity.WARNING
    return Finding(
        id="contention.cpu",
        category=Category.CONTENTION,
        severity=severity,
        title=f"The training thread waits for a CPU {wait:.0%} of its time",
        evidence={
            "train_cpu_wait_share": round(wait, 4),
            "attach_sampler_cpu_share": round(own, 4),
            "train_cpu_share": round(thread.cpu_s / obs.seconds, 4),
            "usable_cores": obs.usable_cores,
            "window_s": round(obs.seconds, 1),
        },
        fix=RESERVE_CORES,
        impact=others,
        subject="host",
    )


def unread(obs: Observation) -> Finding | None:
    """``probe.not_loaded`` when no stack of the job could be read (no right to read its
    memory, py-spy missing or failing): what is said comes from ``/proc`` and the GPUs."""
    problem = obs.access or obs.sampling.problem
    if problem is None or obs.sampling.threads:
        return None
    return Finding(
        id="probe.not_loaded",
        category=Category.FRAMEWORK_CONFIG,
        severity=Severity.WARNING,
        title=f"attach could not read the job's stacks: {problem}",
        evidence={
            "reason": problem,
            "processes": [p.pid for p in obs.tree.processes],
            "seen_from": "/proc and the GPUs' readings only",
            "window_s": round(obs.seconds, 1),
        },
        fix=(
            "Give attach the right to read the job (the reason above says how), then attach "
            "again: where the time goes, the input cause and a hang's place need the stacks."
        ),
        subject=f"pid {obs.tree.root}",
    )


def uses_gpu(obs: Observation) -> bool | None:
    """Whether the job uses a GPU: ``True`` when one is told to be its, ``False``
    without GPU readings, ``None`` when GPUs exist but none could be told its."""
    if obs.gpu.job_gpus:
        return True
    return False if not obs.gpu.samples else None


def gpu_findings(
    obs: Observation, machine: MachineFacts | None, th: Thresholds = DEFAULT_THRESHOLDS
) -> list[Finding]:
    """The run's GPU rules (:data:`GPU_RULES`) over the window's readings."""
    if not obs.gpu.samples:
        return []
    now = time.time()
    root = obs.tree.get(obs.tree.root)
    record = RunRecord(
        meta=RunMeta(
            run_id="attach",
            command=tuple(root.argv) if root is not None else (),
            cwd="",
            started_at=now - obs.seconds,
            ended_at=now,
            gpu_backend=obs.gpu.backend,
        ),
        gpu=list(obs.gpu.samples),
        events=[
            RunEvent(t=now - obs.seconds, kind=EventKind.PROCESS_START, message="", pid=p.pid)
            for p in obs.tree.processes
        ],
    )
    view = RunView.of(record, machine)
    found: list[Finding] = []
    for rule in GPU_RULES:
        found.extend(rule(view, th))
    return found


def diagnose_attached(
    obs: Observation,
    th: Thresholds = DEFAULT_THRESHOLDS,
    machine: MachineFacts | None = None,
    threads: Sequence[TrainingThread] | None = None,
) -> list[Finding]:
    """The findings of an attach window, most important first (module docstring);
    ``threads``: :func:`training_threads` of ``obs`` when already found."""
    threads = training_threads(obs) if threads is None else threads
    hang = stuck(obs, threads)
    if hang is not None:
        return [hang]
    gpu = uses_gpu(obs)
    found: list[Finding] = []
    for t in threads:
        loading = loading_of(t, gpu)
        f = input_finding(obs, t, th, loading)
        if f is not None:
            found.append(f)
        found.extend(host_findings(obs, t, th, loading))
        c = contention(obs, t.process.pid, t.thread.tid, th)
        if c is not None:
            found.append(c)
    blind = unread(obs)
    if blind is not None:
        # Without stacks the training thread is not known: a process's main thread is
        # the likeliest (the loop of a script runs there), and /proc still reads it.
        found.append(blind)
        for p in obs.tree.by_role("training") or obs.tree.by_role("python"):
            c = contention(obs, p.pid, p.pid, th)
            if c is not None:
                found.append(c)
    found.extend(gpu_findings(obs, machine, th))
    judged = [t for t in threads if t.samples >= MIN_SAMPLES]
    if not any(f.severity.rank > Severity.INFO.rank for f in found) and judged:
        t = judged[0]
        training = sum(n for k, n in t.parts.items() if k in TRAINING_PARTS) / t.samples
        found.append(Finding(
            id="run.healthy", category=Category.MODEL, severity=Severity.INFO,
            title=(f"Nothing found slowing the job in this window: its training thread spent "
                   f"{training:.0%} of its time in training code"),
            evidence={"training_code_share": round(training, 4), "samples": t.samples,
                      "window_s": round(obs.seconds, 1)},
            fix=("Nothing to fix; to go faster: a faster GPU, more GPUs (DDP), or a "
                 "cheaper model."),
            impact=0.0, subject=None,
        ))  # fmt: skip
    return rank_findings(found)
