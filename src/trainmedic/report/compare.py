"""Before and after: did a change make training faster, and is the difference more than noise?

Pure functions of run records and their findings. The throughput of each run
comes from its steady steps (warm-up dropped, :mod:`trainmedic.record.stats`):
samples per second when every run knows its batch, else steps per second,
times the training processes that step side by side.

**Is it real?** Noise has two levels. Within a run, step times are not
independent draws (a load episode slows many consecutive steps), so each run is
cut into :data:`BLOCKS` consecutive blocks of steps that are resampled with
replacement. Between runs, what the blocks cannot see differs: page cache, memory
layout, the machine's other tenants. With several runs a side (``compare A1 A2
::: B1 B2``) the bootstrap has two levels: runs, then blocks within each chosen
run. However many runs there are, the interval is at least as wide as the
run-to-run noise measured on an unchanged job (:data:`RUN_NOISE`,
docs/compare.md) allows: a single pair cannot be more certain than that.

**The verdict.** ``faster`` when the whole interval lies above
``1 + min_effect``, ``slower`` when below ``1 - min_effect``, ``no_change``
when it lies within ``1 ± min_effect``; otherwise ``inconclusive``, with how
much more evidence would decide it. Also ``inconclusive``, with ``reasons``
in words and numbers: too few steady steps, a run still warming up, and a
**confounder** that differs between the runs enough to explain the measured
change (other processes' CPU, the training thread's wait for a CPU, steal,
the cgroup's throttling, the GPU's clocks, other processes on the GPU, another
host or GPU model). What the user changed on purpose (the command, torch's
version) is listed, not held against the verdict.

Each run's facts are :mod:`.compare_facts`', the block bootstrap and its noise floor
:mod:`.compare_stats`', the confounders and drifting runs :mod:`.compare_confounders`',
the rows, notes and findings shown beside the verdict :mod:`.compare_side_by_side`'.
What stays here is the verdict they lead to, and the comparison's JSON form.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Finding
from trainmedic.record.types import RunRecord
from trainmedic.report.compare_confounders import (
    confounders,
    differences,
    warming_up,
)
from trainmedic.report.compare_facts import RunFacts, merged, run_facts, samples_known
from trainmedic.report.compare_side_by_side import (
    LOAD_CHANGE,
    FindingChange,
    deliberate_changes,
    ended_badly,
    finding_changes,
    machine_notes,
    measure_rows,
)
from trainmedic.report.compare_stats import bootstrap_ratio, widened

MIN_STEPS = 20
"""Fewer steady steps than this in a run and the verdict is ``inconclusive``."""
RUN_NOISE = 0.12
"""Run-to-run noise of an unchanged job's throughput: the standard deviation of the
log of a run's rate. Measured on the project's shared 2-core machine at 0.093-0.097
(two series of 8 runs of a 60-step input-bound job, ``benchmarks/compare_reruns.py``,
docs/compare.md), rounded up for the uncertainty of an 8-run estimate. The interval
is never narrower than this allows for the runs compared; ``--run-noise`` sets a
machine's own (a dedicated GPU server is far quieter)."""
RESAMPLES = 4000
CONFIDENCE = 0.95
MIN_EFFECT = 0.03
"""A speed-up under 3 % is within what reruns of one configuration differ by."""
VERDICTS = ("faster", "slower", "no_change", "inconclusive")


@dataclass(frozen=True)
class Comparison:
    """The two runs side by side.

    Attributes:
        speedup: after / before throughput (``None``: a run has no steady steps).
        speedup_ci: its confidence interval, (low, high).
        verdict: ``faster``, ``slower``, ``no_change`` or ``inconclusive`` (``reasons``).
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
    reasons: tuple[str, ...] = ()
    """Why the verdict is ``inconclusive``, each in words and numbers."""
    before_runs: tuple[RunFacts, ...] = ()
    after_runs: tuple[RunFacts, ...] = ()
    run_noise: float = 0.0

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
            "runs": {
                "before": [side(r) for r in self.before_runs or (self.before,)],
                "after": [side(r) for r in self.after_runs or (self.after,)],
            },
            "reasons": list(self.reasons),
            "run_noise": self.run_noise,
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
    run_noise: float = RUN_NOISE,
) -> Comparison:
    """Compare two runs (see the module docstring). ``seed`` makes the interval repeatable."""
    return compare_groups(
        [before], [after], [findings_before], [findings_after],
        names=([names[0]], [names[1]]) if names else None, min_effect=min_effect,
        confidence=confidence, resamples=resamples, seed=seed, run_noise=run_noise,
    )  # fmt: skip


def compare_groups(
    befores: Sequence[RunRecord],
    afters: Sequence[RunRecord],
    findings_before: Sequence[Sequence[Finding]],
    findings_after: Sequence[Sequence[Finding]],
    *,
    names: tuple[Sequence[str], Sequence[str]] | None = None,
    min_effect: float = MIN_EFFECT,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
    run_noise: float = RUN_NOISE,
) -> Comparison:
    """Compare repeated runs before a change with repeated runs after it (one or more
    each; see the module docstring)."""
    if not befores or not afters:
        raise ValueError("each side needs at least one run")
    views_b = [RunView.of(r) for r in befores]
    views_a = [RunView.of(r) for r in afters]
    samples = all(samples_known(v) for v in (*views_b, *views_a))
    nb = names[0] if names else [r.meta.run_id for r in befores]
    na = names[1] if names else [r.meta.run_id for r in afters]
    runs_b = tuple(run_facts(v, n, samples) for v, n in zip(views_b, nb, strict=True))
    runs_a = tuple(run_facts(v, n, samples) for v, n in zip(views_a, na, strict=True))
    b, a = merged(runs_b), merged(runs_a)
    metric = "samples_per_s" if samples else "steps_per_s"
    notes: list[str] = []
    reasons: list[str] = []
    speedup = ci = None
    adjusted: tuple[float, tuple[float, float]] | None = None
    verdict = "no_change"
    if b.rate and a.rate:
        speedup = a.rate / b.rate
    short = [r for r in (*runs_b, *runs_a) if r.steady_steps < MIN_STEPS]
    if short:
        reasons.append(
            "too little evidence: "
            + ", ".join(f"{r.name} has {r.steady_steps} steady steps" for r in short)
            + f"; at least {MIN_STEPS} each are needed (run longer: the first steps are "
            "warm-up and are not counted)"
        )
        verdict = "inconclusive"
    elif speedup is not None:
        rng = random.Random(seed)
        drawn = bootstrap_ratio([r.blocks for r in runs_b], [r.blocks for r in runs_a],
                                resamples, confidence, rng)  # fmt: skip
        ci = widened(drawn, speedup, len(runs_b), len(runs_a), run_noise, confidence)
        judged = ci
        factor = (1.0 - b.others_wait_share) / (1.0 - a.others_wait_share)
        if abs(a.others_wait_share - b.others_wait_share) >= LOAD_CHANGE:
            # Other processes took more (or less) of the training thread's time in one
            # side: judge the configurations on what each did while it had a CPU.
            judged = (ci[0] * factor, ci[1] * factor)
            adjusted = (speedup * factor, judged)
            notes.append(
                f"judged on throughput without the training thread's waits for a CPU taken "
                f"by other processes ({b.others_wait_share:.0%} before, "
                f"{a.others_wait_share:.0%} after): {adjusted[0]:.2f}x, interval "
                f"{judged[0]:.2f}x-{judged[1]:.2f}x"
            )
        verdict = _verdict(judged, min_effect)
        # What else differed is weighed against the change as measured (before any
        # adjustment), so that a run slowed by others' load says so even where the
        # adjusted figure alone would leave the verdict open.
        raw = _verdict(ci, min_effect)
        if raw in ("faster", "slower"):
            reasons += confounders(b, a, ci, min_effect, raw)
        elif verdict in ("faster", "slower"):
            reasons += confounders(b, a, judged, min_effect, verdict)
        if verdict == "inconclusive" and not reasons:
            # Open already: what else differed is said beside the noise, whichever way
            # it would have pushed.
            direction = "faster" if speedup >= 1.0 else "slower"
            reasons += [why + ": it alone can change the speed"
                        for _, why in differences(b, a, direction)]  # fmt: skip
        trends = warming_up(runs_b, runs_a)
        if verdict in ("faster", "slower") and not reasons:
            # A run's rate drifting by a factor can bias its figure by as much: it holds
            # the verdict open only where that is enough to explain the change.
            lo, hi = judged
            reasons += [why for most, why in trends
                        if (lo / most <= 1.0 + min_effect if verdict == "faster"
                            else hi * most >= 1.0 - min_effect)]  # fmt: skip
        elif verdict == "inconclusive":
            reasons += [why for _, why in trends]
        if verdict == "inconclusive":
            reasons.append(_more_evidence(judged, min_effect, runs_b, runs_a))
        if reasons:
            verdict = "inconclusive"
    if not samples and any(v.summary.samples_per_step_mean is None for v in (*views_b, *views_a)):
        notes.append("samples per step unknown in a run: throughput compared in steps/s")
    notes += machine_notes(b, a) + deliberate_changes(runs_b, runs_a)
    notes += ended_badly([*views_b, *views_a], [*nb, *na])
    median_b, median_a = b.summary.step_time_median_s, a.summary.step_time_median_s
    median_ratio = median_a / median_b if median_a and median_b else None
    resolved, still, new = finding_changes(
        [f for fs in findings_before for f in fs], [f for fs in findings_after for f in fs]
    )
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
        rows=measure_rows(runs_b, runs_a),
        adjusted_speedup=adjusted[0] if adjusted else None,
        adjusted_ci=adjusted[1] if adjusted else None,
        resolved=resolved,
        still_present=still,
        new=new,
        notes=tuple(notes),
        reasons=tuple(reasons),
        before_runs=runs_b,
        after_runs=runs_a,
        run_noise=run_noise,
    )


def _verdict(interval: tuple[float, float], min_effect: float) -> str:
    lo, hi = interval
    if lo > 1.0 + min_effect:
        return "faster"
    if hi < 1.0 - min_effect:
        return "slower"
    if lo >= 1.0 - min_effect and hi <= 1.0 + min_effect:
        return "no_change"
    return "inconclusive"


def _more_evidence(
    interval: tuple[float, float], min_effect: float, b: Sequence[RunFacts],
    a: Sequence[RunFacts],
) -> str:  # fmt: skip
    """What would decide an interval that straddles the ``±min_effect`` band. The
    interval narrows with the square root of the runs a side (and, within a run's
    noise, of its steps): the factor is how much narrower it must get."""
    lo, hi = interval
    half = (math.log(hi) - math.log(lo)) / 2.0
    centre = (math.log(hi) + math.log(lo)) / 2.0
    band = math.log(1.0 + min_effect)
    # Narrow enough to fall inside the band, or to clear it on the side it leans to.
    room = max(band - abs(centre), abs(centre) - band, 1e-3)
    runs = max(len(b), len(a))
    more = max(runs + 1, math.ceil(runs * (half / room) ** 2))
    said = (f"the interval {lo:.2f}x-{hi:.2f}x is too wide to tell a change of "
            f"{min_effect:.0%} from none: about {more} runs a side")  # fmt: skip
    if more > 100:
        edge = abs(abs(centre) - band) < half / 4
        return (
            f"{said} would decide it, more than a bench should take"
            + (
                f" (the change, if any, is close to the {min_effect:.0%} that counts)"
                if edge
                else ""
            )
            + "; a quieter machine, or this one's own --run-noise "
            "(benchmarks/compare_reruns.py), needs fewer"
        )
    return f"{said} (trainmedic bench --runs {more}) would decide it"


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)
