"""Why a loop that waits on other threads or processes waits: the resource they use.

For a loop without a DataLoader whose wait for data is mostly a wait on others
(:mod:`trainmedic.diagnose.handoff`), the cause is what those others do,
first that holds:

1. too few samples of them working to say -> ``input.handoff`` (information:
   what would settle it);
2. they wait on sockets (or an event loop polls its connections) -> ``input.network``,
   on files -> ``input.io``: requests in flight sized by Little's law, in threads
   or asynchronous requests, never bounded by the cores;
   When the far end of those sockets is a process of this machine (a sample
   store, a feature server; :mod:`trainmedic.host.peers`), its own state
   decides: on a CPU -> ``input.server_cpu`` (more CPU for the server, not more
   requests in flight: they would queue behind it), reading a disk ->
   ``input.io``, asleep -> the network's latency as above;
3. they compute: threads running Python with a core spare -> ``input.gil``
   (processes instead of threads); producer processes or native threads with a
   core spare -> ``input.workers`` (more of them); no core spare -> ``input.cpu``.

The input rule's CPU starvation causes (throttling, others' load) are weighed
before these (:func:`trainmedic.diagnose.input_causes.input_cause`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainmedic.diagnose.handoff import (
    CATEGORY,
    MAX_THREADS,
    Handoff,
    HandoffSizing,
    measure_handoff,
    size_handoff,
)
from trainmedic.diagnose.input_causes import InputCause
from trainmedic.diagnose.loading_cpu import full_bar
from trainmedic.diagnose.sampled import interval_evidence, sampled, share_evidence
from trainmedic.diagnose.server_causes import server_capacity, server_cpu_cause, server_evidence
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.fixes import LOCAL_CACHE_FIX
from trainmedic.findings.model import Category
from trainmedic.record.sample_states import DATA_STATES, HELPER_STATES

TOP_HELPER_FRAMES = 3


def handoff_cause(view: RunView, th: Thresholds, *, starved: bool = False) -> InputCause | None:
    """The cause when the loop's wait for data is a wait on other threads or processes
    (``None`` when it is not, or not clearly, or when the helpers compute and ``starved``:
    the CPU they need goes to others or the quota, the input rule's CPU causes)."""
    if view.train_loaders:
        return None
    h = measure_handoff(view, th)
    if h is None:
        return None
    outside = view.outside_activity()
    data = sum(outside.get(s, 0) for s in DATA_STATES)
    if sampled(h.wait_samples, data, th).versus(th.activity_dominant_share) is not True:
        return None  # the loop mostly builds its batches itself (or it is not known)
    evidence = _evidence(view, th, h, data)
    resource = h.resource(th)
    if resource is None:
        return _unsettled(view, th, h, evidence)
    sizing = size_handoff(view, th, h)
    served = h.server.activity(th) if resource == "network" else None
    if served == "cpu":
        timing = (sizing.step_s, sizing.wait_s, sizing.compute_s) if sizing else None
        return server_cpu_cause(
            view, th, h.server, f"{_who(h)}, which wait on", timing, evidence
        )
    if served is not None:
        evidence["server_resource"] = "io" if served == "file" else "network"
        resource = evidence["server_resource"]
        if sizing is not None:
            sizing = bounded_by_server(view, h, sizing)
    if resource in ("network", "io"):
        return _latency(view, th, h, resource, sizing, evidence)
    if starved:
        return None
    return _compute(view, th, h, has_room(view, th, h), evidence)


def has_room(view: RunView, th: Thresholds, h: Handoff) -> bool:
    """A core spare for more of the helpers' work: the usable cores less what computed
    while the loop waited (the helpers' observations then: Python threads at most one core
    under the interpreter lock, native threads and processes one each; the training thread
    waits) and less others' CPU when they kept the job's threads waiting for one."""
    cores = view.usable_cores
    if cores is None or not h.waits:
        return True  # nothing says the cores are full
    busy = min(h.threads["python"] / h.waits, 1.0) + h.observations["cpu"] / h.waits
    others = view.summary.others_cpu_mean_cores or 0.0
    waits = [w for w in (view.cpu.train_wait_share, view.cpu.loader_wait_share) if w is not None]
    if waits and max(waits) < th.cpu_wait_warning_share:
        others = 0.0  # others used only what the job left (as for the input rule's cores)
    return cores - busy - others >= full_bar(cores, th)


def _who(h: Handoff) -> str:
    n_threads = _per_wait(h, h.threads)
    n_procs = _per_wait(h, h.processes)
    if h.event_loop and h.where == "threads":
        return "an event loop in another thread"
    if h.where == "processes":
        return f"{n_procs:.0f} producer process{'es' if round(n_procs) != 1 else ''}"
    if h.where == "both":
        return f"{n_threads:.0f} threads and {n_procs:.0f} processes"
    return f"{n_threads:.0f} other thread{'s' if round(n_threads) != 1 else ''}"


def _verb(h: Handoff, plural: str, singular: str) -> str:
    """The verb agreeing with :func:`_who`."""
    one = (
        h.where in ("threads", "processes")
        and not h.event_loop
        and round(_per_wait(h, h.threads if h.where == "threads" else h.processes)) == 1
    )
    return singular if one or (h.event_loop and h.where == "threads") else plural


def _per_wait(h: Handoff, obs: Any) -> float:
    return sum(obs.values()) / h.waits if h.waits else 0.0


def _evidence(view: RunView, th: Thresholds, h: Handoff, data: int) -> dict[str, Any]:
    wait = sampled(h.wait_samples, data, th)
    ev: dict[str, Any] = {
        "handoff_waits": h.wait_samples,
        "handoff_answered_waits": h.answered,
        "outside_data_samples": data,
        "handoff_wait_share": round(wait.share, 4),
        "handoff_wait_share_interval": interval_evidence(wait),
        "helpers": h.where,
        "helper_threads_seen": round(_per_wait(h, h.threads), 2),
        "helper_processes_seen": round(_per_wait(h, h.processes), 2),
    }
    ev.update(share_evidence("helper_", h.observations, HELPER_STATES, th, "helper_observations"))
    ev["helper_busy_observations"] = h.busy
    if h.frames:
        ev["helper_top_frames"] = [f"{k} ({n})" for k, n in h.frames.most_common(TOP_HELPER_FRAMES)]
    if view.usable_cores is not None:
        ev["usable_cores"] = view.usable_cores
    ev.update(server_evidence(h.server, th))
    return ev


def bounded_by_server(view: RunView, h: Handoff, sizing: HandoffSizing) -> HandoffSizing:
    """The sizing with its predicted step no shorter than the server's CPU per step on the
    cores it may use: more requests in flight speed up its waiting, not its computing."""
    server_s = h.server.cores * sizing.wait_s
    capacity = server_capacity(view, h.server)
    if server_s <= 0 or server_s / capacity <= sizing.new_step_s:
        return sizing
    floor = server_s / capacity
    return dataclasses.replace(
        sizing,
        new_step_s=floor,
        speedup=max(1.0, sizing.step_s / floor),
        limited_by="server",
        cpu_s=server_s,
        capacity_cores=capacity,
    )


def room_cores(view: RunView) -> float:
    """Usable cores less others' CPU."""
    return max(0.0, (view.usable_cores or 0.0) - (view.summary.others_cpu_mean_cores or 0.0))


def _sizing_evidence(sizing: HandoffSizing) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "handoff_wait_per_step_ms": round(sizing.wait_s * 1000, 3),
        "step_compute_ms": round(sizing.compute_s * 1000, 3),
        "helper_cpu_ms_per_step": round(sizing.cpu_s * 1000, 3),
        "helper_cpu_capacity_cores": round(sizing.capacity_cores, 2),
        "predicted_speedup": round(sizing.speedup, 2),
        "predicted_step_s": round(sizing.new_step_s, 4),
        "speedup_limited_by": sizing.limited_by,
    }
    if sizing.in_flight_now > 0:
        ev["samples_in_flight_now"] = round(sizing.in_flight_now, 2)
        ev["samples_in_flight_needed"] = sizing.in_flight_needed
    if sizing.latency_s is not None and sizing.in_flight_now > 0:
        ev["sample_latency_ms"] = round(sizing.latency_s * 1000, 3)
        ev["sample_latency_low_ms"] = round((sizing.latency_low_s or 0.0) * 1000, 3)
    if sizing.rate_needed is not None:
        ev["samples_per_s_needed"] = round(sizing.rate_needed, 1)
    return ev


def _gain(sizing: HandoffSizing) -> str:
    text = f"Predicted {sizing.speedup:.1f}x faster (step {sizing.new_step_s * 1000:.1f} ms"
    if sizing.limited_by == "gil":
        text += (
            f", bounded by the helpers' Python: {sizing.cpu_s * 1000:.1f} ms a step under one "
            "interpreter lock"
        )
    elif sizing.limited_by == "server":
        text += (
            f", bounded by the data server's CPU: {sizing.cpu_s * 1000:.1f} ms a step on "
            f"{sizing.capacity_cores:.1f} cores"
        )
    elif sizing.limited_by == "cpu":
        text += (
            f", bounded by the helpers' CPU: {sizing.cpu_s * 1000:.1f} ms a step on "
            f"{sizing.capacity_cores:.1f} cores"
        )
    return text + ")"


def _latency(
    view: RunView,
    th: Thresholds,
    h: Handoff,
    resource: str,
    sizing: HandoffSizing | None,
    evidence: dict[str, Any],
) -> InputCause:
    category = CATEGORY[resource]
    on = "network sockets" if resource == "network" else "file reads"
    who = _who(h)
    title = f"the loop waits on {who}, which {_verb(h, 'wait', 'waits')} on {on}"
    if "server_resource" in evidence:
        doing = (
            "reads files"
            if resource == "io"
            else "waits while it answers (neither computing nor reading a disk)"
        )
        title = (
            f"the loop waits on {who}, which {_verb(h, 'wait', 'waits')} on a data server on "
            f"this machine that {doing}"
        )
    share = h.resource_share(resource, th)
    evidence = {**evidence, "helper_resource": resource,
                "helper_resource_share": round(share.share, 4),
                "helper_resource_share_interval": interval_evidence(share)}  # fmt: skip
    cache = (
        "Or copy or cache the samples on local disk before training"
        if resource == "network"
        else "Or copy the data set to local NVMe/SSD (or /dev/shm) and cache decoded samples"
    )
    if sizing is None or sizing.in_flight_now <= 0:
        fix = (
            f"Keep more requests in flight than the {who} do now (more threads or asynchronous "
            f"requests, not processes: a request waiting on {on} holds no CPU). {cache}."
        )
        return InputCause(resource, category, title, fix, evidence, remedies=LOCAL_CACHE_FIX)
    evidence.update(_sizing_evidence(sizing))
    need = sizing.in_flight_needed
    cores = view.usable_cores or 0.0
    evidence["latency_bound"] = need > cores
    rate = sizing.rate_needed
    latency = sizing.latency_s
    per = (
        f" ({rate:.0f} samples/s x {latency * 1000:.0f} ms per sample, +25 %)"
        if rate is not None and latency is not None
        else f" ({sizing.multiplier:.1f}x the {sizing.in_flight_now:.1f} in flight now)"
    )
    if h.where == "processes":
        procs = max(1, round(_per_wait(h, h.processes)))
        threads = math.ceil(need / procs)
        evidence["recommended_threads_per_process"] = threads
        how = (
            f"a concurrent.futures.ThreadPoolExecutor(max_workers={threads}) fetching inside "
            f"each of the {procs} producer processes, or asynchronous requests there"
        )
    elif h.event_loop:
        evidence["recommended_concurrent_requests"] = need
        how = (
            f"{need} concurrent requests on the event loop (asyncio.gather over the next "
            f"batches too, bounded by asyncio.Semaphore({need}), with as many connections)"
        )
    elif need > MAX_THREADS:
        evidence["recommended_concurrent_requests"] = need
        how = f"{need} asynchronous requests (asyncio/aiohttp): more than threads should carry"
    else:
        evidence["recommended_threads"] = need
        how = (
            f"concurrent.futures.ThreadPoolExecutor(max_workers={need}), with the next "
            "batches' requests submitted before this batch is trained on"
        )
    fix = (
        f"Keep {need} samples in flight{per}: {how}. Threads or asynchronous requests, not "
        f"processes or cores: a request waiting on {on} holds no CPU. {_gain(sizing)}. "
        f"{cache}."
    )
    return InputCause(resource, category, title, fix, evidence, remedies=LOCAL_CACHE_FIX)


def _compute(
    view: RunView, th: Thresholds, h: Handoff, room: bool, evidence: dict[str, Any]
) -> InputCause:
    python = h.threads["python"] >= h.observations["cpu"] and h.threads["python"] > 0
    sizing = size_handoff(view, th, h, processes_fix=python and room)
    share = h.resource_share("cpu", th)
    evidence = {**evidence, "helper_resource": "cpu",
                "helper_resource_share": round(share.share, 4),
                "helper_resource_share_interval": interval_evidence(share)}  # fmt: skip
    if sizing is not None:
        evidence.update(_sizing_evidence(sizing))
    who = _who(h)
    cores = view.usable_cores or 4.0
    gain = f". {_gain(sizing)}" if sizing is not None else ""
    if not room:
        fix = (
            "Make each sample cheaper or add cores: the cores are full. Vectorise the batch "
            "building (whole-batch tensor operations instead of per-sample Python), "
            "pre-process the data set once and store the result, or decode and augment on "
            "the GPU."
        )
        if python:
            fix += " Its Python runs one thread at a time (the interpreter lock)."
        return InputCause("cpu", Category.CPU, f"the {who} the loop waits on fill every core",
                          fix, evidence, remedies="")  # fmt: skip
    processes = max(2, min(th.max_recommended_workers, math.floor(cores) - 1 or 1))
    evidence["recommended_processes"] = processes
    if python:
        run = _verb(h, "run", "runs")
        fix = (
            f"The {who} the loop waits on {run} Python, and the threads of one process run "
            "Python one at a time (the interpreter lock): at most one core's work, with "
            f"{room_cores(view):.1f} cores there. Build the samples in processes: "
            f"concurrent.futures.ProcessPoolExecutor(max_workers={processes}) in place of "
            "the threads, or move the batch building into a torch.utils.data.Dataset and "
            f"iterate DataLoader(dataset, num_workers={processes}, persistent_workers=True)"
            f"{gain}."
        )
        title = f"the loop waits on {who} that {run} Python under one interpreter lock"
        return InputCause("gil", Category.FRAMEWORK_CONFIG, title, fix, evidence, remedies="")
    now = max(1, round(_per_wait(h, h.processes) or _per_wait(h, h.threads)))
    more = max(now + 1, processes)
    evidence["recommended_processes"] = more
    fix = (
        f"The {who} the loop waits on compute, and a core is spare: use {more} of them "
        f"(producer processes, or threads where the work is native code){gain}."
    )
    title = f"the loop waits on {who} that compute, with a core spare"
    return InputCause("workers", Category.FRAMEWORK_CONFIG, title, fix, evidence, remedies="")


def _unsettled(view: RunView, th: Thresholds, h: Handoff, evidence: dict[str, Any]) -> InputCause:
    """What the helpers do is not settled: information, with what would settle it - more
    of the run (too few moments sampled), a look elsewhere (they were not the ones
    working), or nothing dominates (their work is split)."""
    need = th.activity_min_samples
    who = _who(h)
    evidence = {**evidence, "settled": False, "helper_observations_needed": need}
    steady = view.steady_time_s
    rate = h.waits / steady if steady > 0 else 0.0
    if h.waits < need:
        more = f"about {(need - h.waits) / rate:.0f} s more of steps like these" if rate else ""
        title = f"the loop waits on {who}, and too few samples show what they do"
        settle = (
            f"{h.waits} samples of the wait, {need} needed: {more or 'a longer run'} would "
            f"settle it (the probe sampled the wait {rate:.1f} times a second)"
        )
    elif h.busy_share(th).versus(th.activity_dominant_share) is not True:
        title = f"the loop waits, but the {who} it could see were mostly idle or blocked"
        settle = (
            f"in {h.waits} samples of the wait they worked in {h.busy} observations: what the "
            "loop waits for is not in a thread or child process of the job the probe sees "
            "(a server outside the job, native threads); look at that"
        )
    else:
        title = f"the loop waits on {who}, whose work is split between resources"
        settle = (
            "no resource holds 40 % of their working observations for sure (the evidence "
            "has each share); a longer run narrows them"
        )
    fix = (
        f"Not settled: {settle}. Meanwhile py-spy dump --pid PID shows every thread's stack; "
        "a wait on sockets wants more requests in flight (threads or asyncio), computing in "
        "Python threads wants processes."
    )
    return InputCause(
        "handoff", Category.FRAMEWORK_CONFIG, title, fix, evidence, settled=False, remedies=""
    )
