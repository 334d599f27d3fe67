"""Time between steps that is not data loading: sleeping, logging, syncs, writes, Python.

In a loop without a DataLoader the probe records the host time outside
forward, backward and the optimizer as the step's wait; the stack samples of
the training thread taken there (:mod:`trainmedic.probe.host_states`) say
what it was. The data part is the input rule's; each other part that costs at
least ``data_wait_warning_share`` of steady time is a finding of its own
(``host.<state>``), its impact that part. Without enough stack samples the
time is not called data: one ``host.unexplained`` finding says how much it is
and how to look. Time inside stalls is the stall rule's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.data_wait import data_wait
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.probe.host_states import DATA_STATES

MAX_FRAMES = 5


@dataclass(frozen=True)
class _Kind:
    category: Category
    what: str
    fix: str


_KINDS: dict[str, _Kind] = {
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
    for state in sorted(activity, key=lambda k: -activity[k]):
        if state in DATA_STATES or activity[state] <= 0:
            continue
        part = outside_share * activity[state] / total
        if part < th.data_wait_warning_share:
            continue
        kind = _KINDS.get(state, _KINDS["other"])
        what = kind.what
        ev = dict(base)
        ev.update({f"outside_{k}_share": round(v / total, 4) for k, v in activity.items() if v})
        ev["top_frames"] = _top_frames(view)
        findings.append(
            Finding(
                id=f"host.{state}",
                category=kind.category,
                severity=(Severity.ERROR if part >= th.data_wait_error_share else Severity.WARNING),
                title=f"{part:.0%} of step time goes outside the training step: {what}",
                evidence=ev,
                fix=kind.fix,
                impact=part,
            )
        )
    return findings


def _unexplained(view: RunView, th: Thresholds, share: float, base: dict[str, Any]) -> Finding:
    return Finding(
        id="host.unexplained",
        category=Category.FRAMEWORK_CONFIG,
        severity=Severity.ERROR if share >= th.data_wait_error_share else Severity.WARNING,
        title=(
            f"{share:.0%} of step time goes outside forward, backward and the optimizer, "
            "and too few stack samples say on what"
        ),
        evidence={**base, "outside_min_samples": th.outside_min_samples},
        fix=(
            "See what the loop does between steps: py-spy top --pid PID (or py-spy dump), "
            "or torch.profiler around a few steps; run again without "
            "TRAINMEDIC_PROBE_DISABLE=stacks if it was set. If it builds batches, move that "
            "into a Dataset and a DataLoader with workers."
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
