"""A wait on the network that is a data server of this machine computing each answer.

When the process at the far end of the sockets the job waits on - through
helper threads (:mod:`trainmedic.diagnose.handoff_causes`), in the training
loop itself or in DataLoader workers (:func:`server_cause`) - is a process of
this machine whose threads are on a CPU in most looks
(:mod:`trainmedic.diagnose.servers`), more requests in flight would only queue
behind it: the cause is its CPU (``input.server_cpu``), and the fix is CPU for it
(more processes of it, cheaper answers) or, with the cores full, cheaper
answers or another machine.

Its CPU per step is ``threads on a CPU x the wait per step``; the predicted
step is the slower of the step's compute and all of that CPU with the step's
own (on a CPU-only run) on the cores others leave. The host's count of
others' CPU includes the server, which is not the job.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainmedic.diagnose.data_wait import data_wait
from trainmedic.diagnose.input_causes import InputCause
from trainmedic.diagnose.loading_cpu import full_bar
from trainmedic.diagnose.sampled import interval_evidence, share_evidence
from trainmedic.diagnose.servers import ServerLooks, measure_servers
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category
from trainmedic.host.peers import ACTIVITIES

PYTHON_LOCK_CORES = 1.5
"""A Python server with at most this many threads on a CPU at a time is held by its
interpreter lock (threads do not add cores to it, processes do)."""


def server_evidence(looks: ServerLooks, th: Thresholds) -> dict[str, Any]:
    """Who the server is and what its looks showed (empty without looks)."""
    if looks.name is None:
        return {}
    pid, _, name = looks.name.partition(" ")
    ev: dict[str, Any] = {
        "data_server_pid": int(pid) if pid.isdigit() else pid,
        "data_server": name,
        "server_observations": looks.observations,
        "server_threads_on_cpu": round(looks.cores, 2),
    }
    ev.update(share_evidence("server_", looks.activities, ACTIVITIES, th, "server_observations"))
    return ev


def server_capacity(view: RunView, looks: ServerLooks) -> float:
    """Cores a server of this machine may use: the usable ones less others' CPU (not
    counting the server's own)."""
    others = max(0.0, (view.summary.others_cpu_mean_cores or 0.0) - looks.cores)
    return max(0.5, (view.usable_cores or 4.0) - others)


def _words(looks: ServerLooks) -> str:
    pid, _, name = (looks.name or "").partition(" ")
    return f"pid {pid}: {name}" if name else f"pid {pid}"


def server_cpu_cause(
    view: RunView,
    th: Thresholds,
    looks: ServerLooks,
    waiting: str,
    timing: tuple[float, float, float] | None,
    evidence: dict[str, Any],
) -> InputCause:
    """``input.server_cpu``: ``waiting`` says who waits on the server ("4 other threads,
    which wait on"); ``timing`` is (step, its wait on the server, the rest), seconds."""
    share = looks.share("cpu", th)
    evidence = {**evidence, **server_evidence(looks, th), "server_resource": "cpu",
                "server_resource_share": round(share.share, 4),
                "server_resource_share_interval": interval_evidence(share)}  # fmt: skip
    usable = view.usable_cores or 4.0
    cores = looks.cores
    others = max(0.0, (view.summary.others_cpu_mean_cores or 0.0) - cores)
    room = usable - cores - others
    program = (looks.name or "").partition(" ")[2].split(" ", 1)[0]
    gain = ""
    if timing is not None:
        step, wait, compute = timing
        server_s = cores * wait  # its CPU while the job waits, per step
        own = compute if view.uses_gpu is not True else 0.0
        capacity = server_capacity(view, looks)
        new_step = max(compute, (server_s + own) / capacity)
        speedup = max(1.0, step / new_step)
        limited = "compute" if new_step <= compute * 1.0001 else "cpu"
        evidence.update({
            "server_wait_per_step_ms": round(wait * 1000, 3),
            "step_compute_ms": round(compute * 1000, 3),
            "server_cpu_ms_per_step": round(server_s * 1000, 3),
            "server_cpu_capacity_cores": round(capacity, 2),
            "predicted_speedup": round(speedup, 2),
            "predicted_step_s": round(new_step, 4),
            "speedup_limited_by": limited,
        })  # fmt: skip
        gain = f" Predicted {speedup:.1f}x faster (step {new_step * 1000:.1f} ms"
        if limited == "cpu":
            gain += f", bounded by the server's CPU: {server_s * 1000:.1f} ms a step on "
            gain += f"{capacity:.1f} cores"
        gain += ")."
    seen = (
        f"it had {cores:.1f} threads on a CPU, on average, in {share.share:.0%} of "
        f"{looks.observations} looks while the job waited on it"
    )
    title = f"the loop waits on {waiting}{' ' if waiting else ''}a data server on this machine"
    title += " that computes"
    server = _words(looks)
    if room < full_bar(usable, th):
        fix = (
            f"The data server on this machine ({server}) computes each answer ({seen}), and "
            "the cores are full: more requests in flight would queue behind it. Make its "
            "answers cheaper (precompute and store them, cache the ones asked often), or "
            f"run it on another machine.{gain}"
        )
        evidence["server_cores_full"] = True
        return InputCause("server_cpu", Category.CPU, title, fix, evidence, remedies="")
    processes = max(2, min(th.max_recommended_workers, math.floor(usable - others)))
    evidence["recommended_server_processes"] = processes
    lock = (
        " Its Python threads run one at a time (the interpreter lock): threads do not add "
        "cores to it, processes do."
        if program.startswith("python") and cores <= PYTHON_LOCK_CORES
        else ""
    )
    fix = (
        f"The data server on this machine ({server}) computes each answer ({seen}): more "
        "requests in flight would queue behind it. Give it the spare cores: run "
        f"{processes} processes of it (behind one port with SO_REUSEPORT, or its own "
        "worker option), or make its answers cheaper (precompute and store them, cache the "
        f"ones asked often).{lock}{gain}"
    )
    return InputCause("server_cpu", Category.CPU, title, fix, evidence, remedies="")


def server_cause(view: RunView, th: Thresholds, cause: InputCause) -> InputCause:
    """The input rule's cause, or - when it is the network and the job's own waits on
    sockets (the loop's, the DataLoader workers') went to a server of this machine that
    the looks show computing - ``input.server_cpu``; a server the looks show in disk
    reads or asleep is named in the evidence (``server_resource``)."""
    if cause.category is not Category.NETWORK or "server_resource" in cause.evidence:
        return cause
    looks = measure_servers(view)
    served = looks.activity(th)
    if served is None:
        return cause
    if served != "cpu":
        resource = "io" if served == "file" else "network"
        if resource == "io":
            return cause  # a server reading a disk behind the sockets: left to the network
        ev = {**cause.evidence, **server_evidence(looks, th), "server_resource": resource}
        return dataclasses.replace(cause, evidence=ev)
    s = view.summary
    step = s.step_time_mean_s
    timing = None
    if step is not None and step > 0 and s.steps_steady > 0:
        wait = data_wait(view, th)
        wait_s = min(step, wait.ordinary_s * (wait.data_share or 0.0) / s.steps_steady)
        timing = (step, wait_s, max(1e-6, step - wait_s))
    waiting = "its DataLoader workers, which wait on" if view.num_workers else ""
    evidence = {k: v for k, v in cause.evidence.items() if not k.startswith("recommended_")}
    evidence.pop("latency_bound", None)
    return server_cpu_cause(view, th, looks, waiting, timing, evidence)
