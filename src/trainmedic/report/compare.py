"""Before and after: did a change make training faster, and is the difference more than noise?

Pure functions of two run records and their findings. The throughput of each
run comes from its steady steps (warm-up dropped, :mod:`trainmedic.record.stats`):
samples per second when both runs know their batch, else steps per second,
times the training processes that step side by side.

**Is it real?** Step times are not independent draws: a load episode on the
machine, a throttled GPU or a slow stretch of storage slows many consecutive
steps. So each run is cut into :data:`BLOCKS` consecutive blocks of steps and
the blocks are resampled with replacement (a block bootstrap): the spread of
the resampled throughput ratio after/before gives a confidence interval that
includes the slow drifts within each run, not only step-to-step jitter. The
verdict is ``faster`` only when the whole interval lies above
``1 + min_effect``, ``slower`` when it lies below ``1 - min_effect``, and
``no_change`` otherwise: a difference the runs cannot tell from their own
variation, or too small to matter, is never called an improvement. A rerun of
the same configuration is ``no_change``.

**What else changed.** The machine can change between runs (another job, a
hot GPU): when the training thread's wait for a CPU, others' CPU or the GPU's
clocks differ noticeably, a note says so beside the verdict.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Finding, Severity
from trainmedic.record.stats import RunSummary, StepSpan
from trainmedic.record.types import RunRecord

BLOCKS = 20
"""Blocks each run is cut into for the bootstrap (fewer when a run is short)."""
MIN_STEPS = 20
"""Fewer steady steps than this in either run and no verdict but ``no_change``."""
RESAMPLES = 4000
CONFIDENCE = 0.95
MIN_EFFECT = 0.03
"""A speed-up under 3 % is within what reruns of one configuration differ by."""
LOAD_CHANGE = 0.05
"""A change of the training thread's CPU wait share by this much is a changed machine."""
OTHERS_MIN_CORES = 0.5
"""Others' CPU from which the training thread's waits are theirs (diagnosis's value)."""

VERDICTS = ("faster", "slower", "no_change")


@dataclass(frozen=True)
class RunFacts:
    """One side of the comparison.

    Attributes:
        name: the run directory's name (or run id).
        rate_unit: ``samples/s`` or ``steps/s``.
        rate: throughput of the job in that unit.
        blocks: (units, seconds) per block of consecutive steady steps, for the bootstrap.
    """

    name: str
    command: tuple[str, ...]
    summary: RunSummary
    steady_steps: int
    processes: int
    samples_known: bool
    rate: float | None
    rate_unit: str
    blocks: tuple[tuple[float, float], ...]
    train_cpu_wait_share: float | None
    others_wait_share: float
    others_cpu_cores: float | None
    gpu_sm_clock_mhz: float | None
    gpu_memory_used_max_gib: float | None


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


@dataclass(frozen=True)
class Comparison:
    """The two runs side by side.

    Attributes:
        speedup: after / before throughput (``None``: a run has no steady steps).
        speedup_ci: its confidence interval, (low, high).
        verdict: ``faster``, ``slower`` or ``no_change``.
        adjusted_speedup / adjusted_ci: when other processes took a different share
            of the training thread's time in the two runs, the ratio and interval
            without those waits, which the verdict is judged on; else ``None``.
        rows: (name, unit, before, after) of the measures shown side by side.
        notes: what else differed, and why a verdict could not be given.
    """

    before: RunFacts
    after: RunFacts
    metric: str
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    verdict: str
    confidence: float
    min_effect: float
    step_time_median_ratio: float | None
    rows: tuple[tuple[str, str, float | None, float | None], ...]
    adjusted_speedup: float | None = None
    adjusted_ci: tuple[float, float] | None = None
    resolved: tuple[FindingChange, ...] = ()
    still_present: tuple[FindingChange, ...] = ()
    new: tuple[FindingChange, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``trainmedic compare --json``)."""

        def side(r: RunFacts) -> dict[str, Any]:
            return {
                "run": r.name,
                "command": list(r.command),
                "steady_steps": r.steady_steps,
                "processes": r.processes,
                "throughput": _round(r.rate),
                "throughput_unit": r.rate_unit,
            }

        def change(c: FindingChange) -> dict[str, Any]:
            return {
                "id": c.id,
                "title": c.title,
                "category": c.category,
                "severity_before": c.severity_before,
                "severity_after": c.severity_after,
                "impact_before": _round(c.impact_before),
                "impact_after": _round(c.impact_after),
            }

        return {
            "tool": "compare",
            "schema_version": 1,
            "before": side(self.before),
            "after": side(self.after),
            "metric": self.metric,
            "speedup": _round(self.speedup),
            "speedup_ci": None if self.speedup_ci is None else [_round(v) for v in self.speedup_ci],
            "verdict": self.verdict,
            "speedup_load_adjusted": _round(self.adjusted_speedup),
            "speedup_load_adjusted_ci": None
            if self.adjusted_ci is None
            else [_round(v) for v in self.adjusted_ci],
            "confidence": self.confidence,
            "min_effect": self.min_effect,
            "step_time_median_ratio": _round(self.step_time_median_ratio),
            "measures": [
                {"name": n, "unit": u, "before": _round(b), "after": _round(a)}
                for n, u, b, a in self.rows
            ],
            "findings": {
                "resolved": [change(c) for c in self.resolved],
                "still_present": [change(c) for c in self.still_present],
                "new": [change(c) for c in self.new],
            },
            "notes": list(self.notes),
        }


def compare_runs(
    before: RunRecord,
    after: RunRecord,
    findings_before: Sequence[Finding],
    findings_after: Sequence[Finding],
    *,
    names: tuple[str, str] | None = None,
    min_effect: float = MIN_EFFECT,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare two runs (see the module docstring). ``seed`` makes the interval repeatable."""
    vb, va = RunView.of(before), RunView.of(after)
    samples = _samples_known(vb) and _samples_known(va)
    b = _facts(vb, names[0] if names else before.meta.run_id, samples)
    a = _facts(va, names[1] if names else after.meta.run_id, samples)
    metric = "samples_per_s" if samples else "steps_per_s"
    notes: list[str] = []
    speedup = ci = None
    adjusted: tuple[float, tuple[float, float]] | None = None
    verdict = "no_change"
    if b.rate and a.rate:
        speedup = a.rate / b.rate
    if b.steady_steps < MIN_STEPS or a.steady_steps < MIN_STEPS:
        notes.append(
            f"too few steady steps to judge ({b.steady_steps} before, {a.steady_steps} after; "
            f"at least {MIN_STEPS} each)"
        )
    elif speedup is not None:
        ci = _bootstrap_ratio(b, a, resamples, confidence, random.Random(seed))
        judged = ci
        factor = (1.0 - b.others_wait_share) / (1.0 - a.others_wait_share)
        if abs(a.others_wait_share - b.others_wait_share) >= LOAD_CHANGE:
            # Other processes took more (or less) of the training thread's time in one
            # run: judge the configurations on what each run did while it had a CPU.
            judged = (ci[0] * factor, ci[1] * factor)
            adjusted = (speedup * factor, judged)
            notes.append(
                f"judged on throughput without the training thread's waits for a CPU taken "
                f"by other processes ({b.others_wait_share:.0%} before, "
                f"{a.others_wait_share:.0%} after): {adjusted[0]:.2f}x, interval "
                f"{judged[0]:.2f}x-{judged[1]:.2f}x"
            )
        if judged[0] > 1.0 + min_effect:
            verdict = "faster"
        elif judged[1] < 1.0 - min_effect:
            verdict = "slower"
    if not samples:
        sb, sa = vb.summary.samples_per_step_mean, va.summary.samples_per_step_mean
        if sb is None or sa is None:
            notes.append("samples per step unknown in a run: throughput compared in steps/s")
    notes += _machine_notes(b, a)
    median_b, median_a = b.summary.step_time_median_s, a.summary.step_time_median_s
    median_ratio = median_a / median_b if median_a and median_b else None
    resolved, still, new = _finding_changes(findings_before, findings_after)
    return Comparison(
        before=b,
        after=a,
        metric=metric,
        speedup=speedup,
        speedup_ci=ci,
        verdict=verdict,
        confidence=confidence,
        min_effect=min_effect,
        step_time_median_ratio=median_ratio,
        rows=_rows(b, a),
        adjusted_speedup=adjusted[0] if adjusted else None,
        adjusted_ci=adjusted[1] if adjusted else None,
        resolved=resolved,
        still_present=still,
        new=new,
        notes=tuple(notes),
    )


# --- throughput and its interval -------------------------------------------------------------


def _samples_known(view: RunView) -> bool:
    return view.summary.steps_steady > 0 and all(s.samples is not None for s in view.steady)


def _facts(view: RunView, name: str, samples: bool) -> RunFacts:
    s = view.summary
    spans = sorted(view.steady, key=lambda x: x.t_end)
    processes = view.concurrent_processes
    blocks = _blocks(spans, samples, processes)
    units = sum(u for u, _ in blocks)
    seconds = sum(t for _, t in blocks)
    gpus = [g for g in s.gpus if g.used_by_job or g.used_by_job is None]
    used = [g.memory_used_max_bytes for g in gpus if g.memory_used_max_bytes is not None]
    clocks = [g.sm_clock_mean_mhz for g in gpus if g.sm_clock_mean_mhz is not None]
    return RunFacts(
        name=name,
        command=tuple(view.record.meta.command),
        summary=s,
        steady_steps=s.steps_steady,
        processes=processes,
        samples_known=samples,
        rate=units / seconds if seconds > 0 else None,
        rate_unit="samples/s" if samples else "steps/s",
        blocks=tuple(blocks),
        train_cpu_wait_share=view.cpu.train_wait_share,
        others_wait_share=_others_wait_share(view),
        others_cpu_cores=s.others_cpu_mean_cores,
        gpu_sm_clock_mhz=statistics.fmean(clocks) if clocks else None,
        gpu_memory_used_max_gib=max(used) / 2**30 if used else None,
    )


def _others_wait_share(view: RunView) -> float:
    """The training thread's wait for a CPU that other processes caused (0 when its own
    threads outnumbering the cores explain it better: the contention rule's attribution)."""
    cpu = view.cpu
    wait = cpu.train_wait_share
    others = view.summary.others_cpu_mean_cores or 0.0
    if wait is None or others < OTHERS_MIN_CORES:
        return 0.0
    cores = view.usable_cores
    own_excess = max(0.0, (cpu.job_runnable_cores or 0.0) - (cores or float("inf")))
    return min(0.95, wait) if others >= own_excess else 0.0


def _blocks(spans: Sequence[StepSpan], samples: bool, processes: int) -> list[tuple[float, float]]:
    """(units, seconds) per block of consecutive spans; units are samples (or steps) times
    the processes stepping side by side, so units/seconds is the job's rate."""
    if not spans:
        return []
    steps = sum(s.count for s in spans)
    n_blocks = max(1, min(BLOCKS, steps // 5))
    per_block = steps / n_blocks
    blocks: list[list[float]] = [[0.0, 0.0] for _ in range(n_blocks)]
    seen = 0
    for s in spans:
        i = min(n_blocks - 1, int(seen / per_block))
        units = (s.samples if samples and s.samples is not None else s.count) * processes
        blocks[i][0] += units
        blocks[i][1] += s.duration_s
        seen += s.count
    return [(u, t) for u, t in blocks if t > 0]


def _bootstrap_ratio(
    b: RunFacts, a: RunFacts, resamples: int, confidence: float, rng: random.Random
) -> tuple[float, float]:
    ratios = []
    for _ in range(resamples):
        rb = _resampled_rate(b.blocks, rng)
        ra = _resampled_rate(a.blocks, rng)
        if rb > 0:
            ratios.append(ra / rb)
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    lo = ratios[max(0, math.floor(tail * len(ratios)))]
    hi = ratios[min(len(ratios) - 1, math.ceil((1.0 - tail) * len(ratios)) - 1)]
    return lo, hi


def _resampled_rate(blocks: Sequence[tuple[float, float]], rng: random.Random) -> float:
    units = seconds = 0.0
    for _ in range(len(blocks)):
        u, t = blocks[rng.randrange(len(blocks))]
        units += u
        seconds += t
    return units / seconds if seconds > 0 else 0.0


# --- side by side ---------------------------------------------------------------------------


def _rows(b: RunFacts, a: RunFacts) -> tuple[tuple[str, str, float | None, float | None], ...]:
    sb, sa = b.summary, a.summary

    def pct(v: float | None) -> float | None:
        return None if v is None else 100.0 * v

    return (
        ("throughput", b.rate_unit, b.rate, a.rate),
        ("step time, median", "s", sb.step_time_median_s, sa.step_time_median_s),
        ("step time, p90", "s", sb.step_time_p90_s, sa.step_time_p90_s),
        ("data wait", "% of step", pct(sb.data_wait_share), pct(sa.data_wait_share)),
        ("forward/backward/optimizer", "% of step", pct(sb.compute_share), pct(sa.compute_share)),
        ("GPU time", "% of step", pct(sb.gpu_time_share), pct(sa.gpu_time_share)),
        ("GPU utilization", "%", sb.gpu_utilization_mean_pct, sa.gpu_utilization_mean_pct),
        ("GPU memory used, max", "GiB", b.gpu_memory_used_max_gib, a.gpu_memory_used_max_gib),
        ("job CPU", "cores", sb.job_cpu_mean_cores, sa.job_cpu_mean_cores),
        ("training thread waiting for a CPU", "%", pct(b.train_cpu_wait_share),
         pct(a.train_cpu_wait_share)),
        ("others' CPU", "cores", b.others_cpu_cores, a.others_cpu_cores),
        ("steady steps", "", float(b.steady_steps), float(a.steady_steps)),
    )  # fmt: skip


def _machine_notes(b: RunFacts, a: RunFacts) -> list[str]:
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


def _finding_changes(
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


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)
