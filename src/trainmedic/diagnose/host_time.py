"""Time between steps that is not data loading: sleeping, logging, syncs, writes, Python.

In a loop without a DataLoader the probe records the host time outside
forward, backward and the optimizer as the step's wait; the stack samples of
the training thread taken there (:mod:`trainmedic.probe.host_states`) say
what it was. The data part is the input rule's; each other part that costs at
least ``data_wait_warning_share`` of steady time is a finding of its own
(``host.<state>``), its impact that part. Without enough stack samples the
time is not called data: one ``host.unexplained`` finding (information) says
how much it is and what would settle it. A part is decided on its sampled
interval (:mod:`trainmedic.diagnose.sampled`): one whose interval straddles
the bar is information. Time inside stalls is the stall rule's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.data_wait import batch_building_is_tiny, data_wait
from trainmedic.diagnose.sampled import interval_evidence, sampled, share_evidence
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.sample_states import DATA_STATES

MAX_FRAMES = 5
SHORT_STEP_S = 0.001
"""Steps shorter than this spend most of their host time on per-call overhead (a
Python call and a tiny tensor op cost microseconds each, whatever the data)."""


@dataclass(frozen=True)
class _Kind:
    category: Category
    what: str
    fix: str


HOST_KINDS: dict[str, _Kind] = {
    "sleep": _Kind(
        Category.FRAMEWORK_CONFIG,
        "the loop sleeps (time.sleep)",
        "Remove the sleep from the training loop; to wait for new data, block on its source "
        "(a queue's get(), a DataLoader) instead of sleeping and polling.",
    ),
    "log": _Kind(
        Category.FRAMEWORK_CONFIG,
        "the loop logs (print, logging, progress bars, trackers)",
        "Log less often and less: every N steps (e.g. 50), scalars rather than whole "
        "tensors, debug messages off (logger.setLevel(logging.INFO)); hand records to a "
        "background thread (logging.handlers.QueueHandler) so writes leave the loop.",
    ),
    "sync": _Kind(
        Category.FRAMEWORK_CONFIG,
        "the loop waits for the GPU: .item(), .cpu(), .tolist() force a synchronisation",
        "Keep running statistics on the device (total += loss.detach(); correct += "
        "(pred == y).sum()) and read them with .item()/.tolist() every N steps, when "
        "printing; avoid .cpu()/.numpy() of outputs inside the loop.",
    ),
    "file_write": _Kind(
        Category.IO,
        "the loop writes files (checkpoints)",
        "Save less often, to a local SSD, or asynchronously "
        "(torch.distributed.checkpoint.async_save, or a background thread saving a CPU "
        "copy); mark saves with `with trainmedic.phase('checkpoint'):` so they are "
        "reported as checkpoints, not as training time.",
    ),
    "python": _Kind(
        Category.CPU,
        "the loop's own code (Python, tensor work outside forward/backward/optimizer) "
        "runs between steps",
        "Take the per-step Python work off the critical path: express it as tensor "
        "operations (vectorise), do it every N steps, or hand it to a background "
        "thread; the frames below show where it runs (py-spy top --pid PID for more).",
    ),
    "other": _Kind(
        Category.FRAMEWORK_CONFIG,
        "the loop waits in calls trainmedic does not recognise (locks, events, C code)",
        "Profile the loop between steps (py-spy dump --pid PID, or torch.profiler) to see "
        "what it waits for; the frames below show where.",
    ),
}


def host_time(view: RunView, th: Thresholds) -> list[Finding]:
    """One finding per kind of non-data time outside the step that costs at least
    ``data_wait_warning_share`` of steady time (see the module docstring)."""
    s = view.summary
    if view.train_loaders or s.steps_steady < th.min_steady_steps or view.steady_time_s <= 0:
        return []
    wait = data_wait(view, th)
    outside_share = wait.ordinary_s / view.steady_time_s
    if outside_share < th.data_wait_warning_share:
        return []
    activity = view.outside_activity()
    if view.uses_gpu is False and activity.get("sync"):
        # No device to wait for: turning tensors into Python values is Python work.
        activity["python"] += activity.pop("sync")
    if batch_building_is_tiny(view, th, activity):
        # Tensor work too small to hand to a worker: the loop's own (data_wait.py).
        activity["python"] += activity.pop("transform")
    total = sum(activity.values())
    base: dict[str, Any] = {
        "outside_step_share": outside_share,
        "step_time_median_s": s.step_time_median_s,
        "steady_steps": s.steps_steady,
        "host_compute_share": s.compute_share,
        "outside_stack_samples": total,
        "data_wait_warning_share": th.data_wait_warning_share,
        "data_wait_error_share": th.data_wait_error_share,
    }
    if wait.stall_s > 0:
        base["stall_wait_excluded_s"] = wait.stall_s
    if wait.data_share is None:
        return [_unexplained(view, th, outside_share, base)]
    findings = []
    seen = [k for k, v in activity.items() if v > 0]
    for state in sorted(activity, key=lambda k: -activity[k]):
        if state in DATA_STATES or activity[state] <= 0:
            continue
        share = sampled(activity[state], total, th)
        part = outside_share * share.share
        verdict = share.versus(th.data_wait_warning_share, outside_share)
        if verdict is False or (verdict is None and part < th.data_wait_warning_share):
            continue
        kind = HOST_KINDS.get(state, HOST_KINDS["other"])
        what = kind.what
        ev = dict(base)
        ev.update(share_evidence("outside_", activity, seen, th, "outside_stack_samples"))
        ev["outside_part_interval"] = interval_evidence(share, outside_share)
        ev["top_frames"] = _top_frames(view)
        title = f"{part:.0%} of step time goes outside the training step: {what}"
        fix = kind.fix
        median = s.step_time_median_s
        if state == "python" and median is not None and median < SHORT_STEP_S:
            fix += (
                f" Steps this short ({median * 1000:.2f} ms) are mostly the overhead of each "
                "call: a larger batch (fewer, bigger steps) does the same work with less of it."
            )
        if verdict is None:
            # The part straddles the bar: said, not decided.
            severity = Severity.INFO
            ev["settled"] = False
            low, high = share.low * outside_share, share.high * outside_share
            title = (
                f"{part:.0%} of step time ({low:.0%}-{high:.0%} from {total} stack samples) "
                f"may go outside the training step: {what}"
            )
            fix = f"Not settled: a longer run settles it. If so: {fix}"
        elif share.versus(th.data_wait_error_share, outside_share):
            severity = Severity.ERROR
        else:
            severity = Severity.WARNING
        findings.append(
            Finding(
                id=f"host.{state}",
                category=kind.category,
                severity=severity,
                title=title,
                evidence=ev,
                fix=fix,
                impact=part,
            )
        )
    return findings


def _unexplained(view: RunView, th: Thresholds, share: float, base: dict[str, Any]) -> Finding:
    """Too few samples to say what the time outside the step is: information, with what
    would settle it (an error is for measured harm, and this is not yet known)."""
    samples = int(base.get("outside_stack_samples") or 0)
    need = th.outside_min_samples
    steady = view.steady_time_s
    median = view.summary.step_time_median_s
    if samples > 0 and steady > 0:
        rate = samples / steady  # samples per second of steps, as this run took them
        more_s = (need - samples) / rate
        steps = f" (about {more_s / median:,.0f} steps like these)" if median else ""
        settle = (
            f"a run with about {more_s:.1f} s more of steps{steps} settles it: the probe "
            f"took {rate:.0f} samples a second of the time between steps"
        )
    else:
        settle = (
            "no stack sample was taken between steps: a run long enough for a few hundred "
            "milliseconds of steps settles it (without TRAINMEDIC_PROBE_DISABLE=stacks, if "
            "it was set)"
        )
    return Finding(
        id="host.unexplained",
        category=Category.FRAMEWORK_CONFIG,
        severity=Severity.INFO,
        title=(
            f"{share:.0%} of step time goes outside forward, backward and the optimizer, "
            f"and {samples} stack samples (of the {need} needed) cannot say on what"
        ),
        evidence={**base, "outside_min_samples": need, "settled": False},
        fix=(
            f"Not settled: {settle}. To see it now: py-spy top --pid PID (or py-spy dump), "
            "or torch.profiler around a few steps."
        ),
        impact=share,
    )


def _top_frames(view: RunView) -> list[str]:
    pids = frozenset(a.pid for a in view.record.loader_activity) - view.loader_pids
    frames: Counter[str] = Counter()
    for a in view.record.loader_activity:
        if a.pid in pids:
            frames.update(a.top_frames)
    return [f"{k} ({n})" for k, n in frames.most_common(MAX_FRAMES)]
