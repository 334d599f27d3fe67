"""What a comparison shows beside its verdict: the measures of the two sides in rows,
the findings resolved, still present or new, and, in words, what else differed (the
machine's load, the GPU's clocks, the processes), what the user changed on purpose
(command, script, torch) and runs that ended badly. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Finding, Severity

if TYPE_CHECKING:
    from trainmedic.report.compare_facts import RunFacts

LOAD_CHANGE = 0.05
"""A change of the training thread's CPU wait share by this much is a changed machine."""


@dataclass(frozen=True)
class FindingChange:
    """A finding of either run: resolved, still present or new."""

    id: str
    title: str
    category: str
    severity_before: str | None
    severity_after: str | None
    impact_before: float | None
    impact_after: float | None


def measure_rows(
    runs_b: Sequence[RunFacts], runs_a: Sequence[RunFacts]
) -> tuple[tuple[str, str, float | None, float | None], ...]:
    """The measures side by side, each the mean over a side's runs."""

    def mean_of(runs: Sequence[RunFacts], get: Callable[[RunFacts], float | None]) -> float | None:
        known = [v for v in (get(r) for r in runs) if v is not None]
        return statistics.fmean(known) if known else None

    def pct(v: float | None) -> float | None:
        return None if v is None else 100.0 * v

    measures: tuple[tuple[str, str, Callable[[RunFacts], float | None]], ...] = (
        ("throughput", runs_b[0].rate_unit, lambda r: r.rate),
        ("step time, median", "s", lambda r: r.summary.step_time_median_s),
        ("step time, p90", "s", lambda r: r.summary.step_time_p90_s),
        ("data wait", "% of step", lambda r: pct(r.summary.data_wait_share)),
        ("forward/backward/optimizer", "% of step", lambda r: pct(r.summary.compute_share)),
        ("GPU time", "% of step", lambda r: pct(r.summary.gpu_time_share)),
        ("GPU utilization", "%", lambda r: r.summary.gpu_utilization_mean_pct),
        ("GPU memory used, max", "GiB", lambda r: r.gpu_memory_used_max_gib),
        ("job CPU", "cores", lambda r: r.summary.job_cpu_mean_cores),
        ("training thread waiting for a CPU", "%", lambda r: pct(r.train_cpu_wait_share)),
        ("others' CPU", "cores", lambda r: r.others_cpu_cores),
        ("steady steps", "", lambda r: float(r.steady_steps)),
    )
    return tuple((name, unit, mean_of(runs_b, get), mean_of(runs_a, get))
                 for name, unit, get in measures)  # fmt: skip


def machine_notes(b: RunFacts, a: RunFacts) -> list[str]:
    notes = []
    wb, wa = b.train_cpu_wait_share, a.train_cpu_wait_share
    if wb is not None and wa is not None and abs(wa - wb) >= LOAD_CHANGE:
        notes.append(
            f"the machine changed between the runs: the training thread waited for a CPU "
            f"{wb:.0%} of its time before and {wa:.0%} after (other processes' load)"
        )
    cb, ca = b.gpu_sm_clock_mhz, a.gpu_sm_clock_mhz
    if cb and ca and abs(ca - cb) / cb >= 0.05:
        notes.append(
            f"the GPU ran at different clocks: {cb:.0f} MHz before, {ca:.0f} MHz after "
            "(heat or power limits)"
        )
    if b.processes != a.processes:
        notes.append(f"{b.processes} training process(es) before, {a.processes} after")
    return notes


def finding_changes(
    before: Sequence[Finding], after: Sequence[Finding]
) -> tuple[tuple[FindingChange, ...], tuple[FindingChange, ...], tuple[FindingChange, ...]]:
    """Warnings and errors by id: resolved (before only), still present, new (after only)."""

    def problems(fs: Sequence[Finding]) -> dict[str, Finding]:
        out: dict[str, Finding] = {}
        for f in fs:
            if f.severity is not Severity.INFO:
                out.setdefault(f.id, f)
        return out

    pb, pa = problems(before), problems(after)

    def change(fid: str) -> FindingChange:
        fb, fa = pb.get(fid), pa.get(fid)
        ref = fa or fb
        assert ref is not None
        return FindingChange(
            id=fid,
            title=ref.title,
            category=ref.category.value,
            severity_before=fb.severity.value if fb else None,
            severity_after=fa.severity.value if fa else None,
            impact_before=fb.impact if fb else None,
            impact_after=fa.impact if fa else None,
        )

    resolved = tuple(change(i) for i in pb if i not in pa)
    still = tuple(change(i) for i in pb if i in pa)
    new = tuple(change(i) for i in pa if i not in pb)
    return resolved, still, new


def ended_badly(views: Sequence[RunView], names: Sequence[str]) -> list[str]:
    """Runs whose job failed or was killed: their steps up to then are compared, and
    the comparison says so (a fix that makes a job crash is no speed-up)."""
    from trainmedic.report.run_summary import format_exit_code

    out = []
    for view, name in zip(views, names, strict=True):
        code = view.record.meta.exit_code
        if code not in (0, None):
            out.append(
                f"{name} ended with exit code {format_exit_code(code)}: its steps until then "
                "are compared"
            )
    return out


def deliberate_changes(b: Sequence[RunFacts], a: Sequence[RunFacts]) -> list[str]:
    """What the user changed on purpose: listed, not held against the verdict."""
    out = []
    cb = {" ".join(r.command) for r in b}
    ca = {" ".join(r.command) for r in a}
    if cb != ca:
        out.append("the command changed: " + "; ".join(sorted(cb))[:160] + " -> "
                   + "; ".join(sorted(ca))[:160])  # fmt: skip
    sb = {r.script for r in b if r.script}
    sa = {r.script for r in a if r.script}
    if sb and sa and sb != sa:
        out.append(f"the script changed: {', '.join(sorted(sb))} -> {', '.join(sorted(sa))}")
    tb = {r.torch_version for r in b if r.torch_version}
    ta = {r.torch_version for r in a if r.torch_version}
    if tb and ta and tb != ta:
        out.append(f"torch changed: {', '.join(sorted(tb))} -> {', '.join(sorted(ta))}")
    return out
