"""The parts of a finding must agree: checks every finding passes before it is emitted.

A rule builds a finding from several measurements; when they disagree the
finding misleads however right each number is (a 94 % wait "fixed" for a
1.1x speed-up, DataLoader settings for a loop without a DataLoader, a worker
count bounded by cores for loading that waits on the network). Each check is
a small function of the finding and the run (:data:`CHECKS`); a problem's text
says what disagrees. :func:`diagnose_run <trainmedic.diagnose.diagnose_run>`
applies every check to every finding, whichever rule made it:

* strictly (tests, ``strict=True``): a problem raises :class:`InconsistentFinding`;
* otherwise the finding is kept, as information, with its problems in
  ``evidence["consistency_problems"]``: a contradiction is never a warning.

What the checks read of a finding is its evidence's vocabulary:
``predicted_speedup`` / ``speedup_limited_by`` (what bounds the speed-up),
``latency_bound`` with the in-flight counts, ``settled``, and shares from
stack samples, which come with an ``_interval`` (:mod:`trainmedic.diagnose.sampled`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.loader_advice import MIN_GAIN
from trainmedic.diagnose.sampled import dominant_of
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.errors import TrainmedicError
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.sample_states import DATA_STATES, HELPER_STATES, OUTSIDE_STATES
from trainmedic.record.sample_states import WAIT_STATES as STACK_STATES

PROBLEMS_KEY = "consistency_problems"
SPEEDUP_SLACK = 1.25
"""A predicted speed-up may exceed ``1 / (1 - impact)`` by this factor: the impact is the
exposed wait of all steady steps, the speed-up is sized from the mean step."""
# Shares measured by stack samples, by evidence prefix, and the count they are taken over.
SAMPLE_COUNTS = {
    "loader_": "loader_stack_samples",
    "outside_": "outside_stack_samples",
    "helper_": "helper_observations",
    "server_": "server_observations",
    "handoff_": "outside_data_samples",
    "data_wait_": "outside_stack_samples",
}
_SAMPLED_STATES = frozenset(
    {*STACK_STATES, *DATA_STATES, *OUTSIDE_STATES, *HELPER_STATES, "other", "resource", "step_data"}
)
_SAMPLED_SHARE = re.compile(r"^(loader|outside|helper|server)_([a-z_]+)_share$")
# Where a category is chosen from stack samples: the state that decides it.
_STATE_CATEGORY = {
    "loader_file_read_share": Category.IO,
    "loader_socket_wait_share": Category.NETWORK,
}
_RESOURCE_CATEGORY = {"network": Category.NETWORK, "io": Category.IO, "cpu": Category.CPU}
_PARALLEL_FIXED = frozenset({Category.IO, Category.NETWORK, Category.FRAMEWORK_CONFIG})
_IN_FLIGHT_WAYS = ("ThreadPoolExecutor", "asyncio", "ThreadedFetch", "asynchronous")
_LOADER_SETTINGS = ("num_workers=", "prefetch_factor=", "persistent_workers=", "pin_memory=")


class InconsistentFinding(TrainmedicError):
    """A finding whose parts disagree, in a strict diagnosis (a rule's bug).

    Attributes:
        finding_id: the finding.
        problems: what disagrees.
    """

    def __init__(self, finding_id: str, problems: Sequence[str]) -> None:
        self.finding_id = finding_id
        self.problems = tuple(problems)
        super().__init__(f"finding {finding_id} contradicts itself: " + "; ".join(problems))


@dataclass(frozen=True)
class Context:
    """What the checks know of the run."""

    has_loader: bool
    usable_cores: float | None
    th: Thresholds

    @classmethod
    def of(cls, view: RunView, th: Thresholds) -> Context:
        return cls(bool(view.train_loaders), view.usable_cores, th)


Check = Callable[[Finding, Context], "str | None"]


def unsettled_is_information(f: Finding, ctx: Context) -> str | None:
    """Not knowing is information: an error or a warning is for measured harm."""
    if f.evidence.get("settled") is False and f.severity is not Severity.INFO:
        return f"an unsettled verdict is {f.severity.value}, not info"
    return None


def shares_from_enough_samples(f: Finding, ctx: Context) -> str | None:
    """A share from stack samples comes with its interval and at least the minimum count."""
    ev = f.evidence
    minimum = ctx.th.activity_min_samples
    for key in ev:
        sampled = key.endswith("_share") and f"{key}_interval" in ev
        match = _SAMPLED_SHARE.match(key)
        if not sampled and match is not None and match.group(2) in _SAMPLED_STATES:
            return f"{key} is reported without its interval"
        if not sampled:
            continue
        count_key = next((c for p, c in SAMPLE_COUNTS.items() if key.startswith(p)), None)
        count = ev.get(count_key) if count_key else None
        if not isinstance(count, (int, float)):
            return f"{key} is reported without the count of samples it comes from"
        if count < minimum:
            return f"{key} comes from {count} samples, fewer than the minimum {minimum}"
    return None


def speedup_follows_from_shares(f: Finding, ctx: Context) -> str | None:
    """The predicted speed-up fits the time the finding says is lost: no more than
    removing it all gains, and much less only with the limit named."""
    s = f.evidence.get("predicted_speedup")
    if not isinstance(s, (int, float)) or f.impact is None or f.impact >= 1.0:
        return None
    whole = 1.0 / (1.0 - f.impact)
    if s > whole * SPEEDUP_SLACK + 0.05:
        return (
            f"predicts {s:.2f}x, more than removing the whole {f.impact:.0%} gains ({whole:.2f}x)"
        )
    limit = f.evidence.get("speedup_limited_by")
    half = 1.0 + 0.5 * (whole - 1.0)
    if s < half and limit in (None, "compute"):
        return (
            f"a {f.impact:.0%} loss fixed for {s:.2f}x (removing it gains {whole:.2f}x) "
            "without naming what limits it"
        )
    return None


def loader_settings_need_a_loader(f: Finding, ctx: Context) -> str | None:
    """DataLoader settings only where there is a DataLoader (or the fix builds one)."""
    if ctx.has_loader:
        return None
    if f.apply and "dataloader" in f.apply:
        return "applies DataLoader settings to a loop without a DataLoader"
    builds = "Dataset" in f.fix
    if not builds and any(s in f.fix for s in _LOADER_SETTINGS):
        return "gives DataLoader settings to a loop without a DataLoader"
    return None


def latency_not_bounded_by_cores(f: Finding, ctx: Context) -> str | None:
    """Loading that waits on latency gets as many in flight as it needs, not a core count."""
    ev = f.evidence
    if ev.get("latency_bound") is not True or f.category not in _PARALLEL_FIXED:
        return None  # (a CPU full or taken by others is not fixed by more in flight)
    gain = ev.get("predicted_speedup")
    if isinstance(gain, (int, float)) and gain < MIN_GAIN:
        return None  # no gain predicted from it: no parallel fix is given
    needed = ev.get("samples_in_flight_needed")
    if not isinstance(needed, (int, float)):
        return "latency-bound without the samples in flight it needs"
    if "usable cores" in f.fix:
        return "sizes latency-bound loading by the usable cores"
    if not any(way in f.fix for way in _IN_FLIGHT_WAYS):
        return "latency-bound, but the fix does not say how so many are kept in flight"
    capacity = _in_flight_capacity(ev)
    if capacity is None:
        return "latency-bound without a count of threads or requests in flight"
    if capacity < needed:
        return f"advises {capacity} in flight where {needed} are needed"
    return None


def _in_flight_capacity(ev: Mapping[str, Any]) -> float | None:
    for key in ("recommended_threads", "recommended_concurrent_requests"):
        if isinstance(ev.get(key), (int, float)):
            return float(ev[key])
    per = ev.get("recommended_threads_per_process")
    procs = ev.get("helper_processes_seen")
    if isinstance(per, (int, float)) and isinstance(procs, (int, float)):
        return float(per) * max(1.0, round(procs))
    workers = ev.get("recommended_num_workers")
    threads = ev.get("recommended_threads_per_worker")
    if isinstance(workers, (int, float)) and isinstance(threads, (int, float)):
        return float(workers) * float(threads)
    return None


def category_follows_the_evidence(f: Finding, ctx: Context) -> str | None:
    """The category is the one the dominant sampled state names (files: io, sockets:
    network), for findings that choose it from stack samples."""
    if not (f.id.startswith("input.") or f.id.startswith("distributed.straggler.data")):
        return None
    ev = f.evidence
    # A server of this machine at the far end of the sockets the job waits on decides what
    # that wait on the network is made of.
    served = ev.get("server_resource")
    if isinstance(served, str) and served in _RESOURCE_CATEGORY:
        if f.category is not _RESOURCE_CATEGORY[served]:
            return f"the data server's work is {served} but the category is {f.category.value}"
        return None
    shares = {}
    for key, value in ev.items():
        interval = ev.get(f"{key}_interval")
        if key.startswith("loader_") and isinstance(interval, list) and len(interval) == 2:
            shares[key] = (float(value), float(interval[0]), float(interval[1]))
    top = dominant_of(shares, ctx.th.activity_dominant_share)
    if top is not None:
        category = _STATE_CATEGORY.get(top)
        if category is not None and f.category is not category:
            return f"{top} dominates ({ev[top]}) but the category is {f.category.value}"
    resource = ev.get("helper_resource")
    expected = _RESOURCE_CATEGORY.get(resource) if resource in ("network", "io") else None
    if expected is not None and f.category is not expected:
        return f"the helpers wait on {resource} but the category is {f.category.value}"
    if resource == "cpu" and f.category in (Category.IO, Category.NETWORK):
        return f"the helpers compute but the category is {f.category.value}"
    return None


CHECKS: tuple[Check, ...] = (
    unsettled_is_information,
    shares_from_enough_samples,
    speedup_follows_from_shares,
    loader_settings_need_a_loader,
    latency_not_bounded_by_cores,
    category_follows_the_evidence,
)
"""Every check, in the order they are applied (an impact outside 0..1 the finding model
itself refuses)."""


def problems(f: Finding, ctx: Context, checks: Sequence[Check] = CHECKS) -> list[str]:
    """What disagrees in ``f`` (empty: its parts agree)."""
    return [p for p in (check(f, ctx) for check in checks) if p is not None]


def checked(
    findings: Sequence[Finding],
    view: RunView,
    th: Thresholds,
    *,
    strict: bool = False,
    checks: Sequence[Check] = CHECKS,
) -> list[Finding]:
    """``findings`` after the checks: unchanged when consistent; otherwise, strictly,
    :class:`InconsistentFinding`, else the finding as information with its problems."""
    ctx = Context.of(view, th)
    out = []
    for f in findings:
        found = problems(f, ctx, checks)
        if not found:
            out.append(f)
            continue
        if strict:
            raise InconsistentFinding(f.id, found)
        evidence = {**f.evidence, PROBLEMS_KEY: found}
        out.append(dataclasses.replace(f, severity=Severity.INFO, evidence=evidence))
    return out
