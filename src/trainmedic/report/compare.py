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

The block bootstrap and its noise floor are :mod:`.compare_stats`'; the confounders
and drifting runs :mod:`.compare_confounders`'. What stays here (about 650 lines) is
one pipeline: each run's facts, the verdict they lead to, and the side-by-side rows,
which change together whenever a measure is added to the comparison.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Finding, Severity
from trainmedic.record.stats import RunSummary
from trainmedic.record.types import RunRecord
from trainmedic.report.compare_confounders import (
    confounders,
    differences,
    warming_up,
)
from trainmedic.report.compare_stats import (
    blocks_of,
    bootstrap_ratio,
    halves,
    widened,
)

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
LOAD_CHANGE = 0.05
"""A change of the training thread's CPU wait share by this much is a changed machine."""
OTHERS_MIN_CORES = 0.5
"""Others' CPU from which the training thread's waits are theirs (diagnosis's value)."""

VERDICTS = ("faster", "slower", "no_change", "inconclusive")


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
    usable_cores: float | None = None
    steal_pct: float | None = None
    throttled_share: float | None = None
    foreign_gpu_processes: int = 0
    host: str | None = None
    gpu_models: tuple[str, ...] = ()
    torch_version: str | None = None
    halves: tuple[float, float] | None = None
    """The rate of the first and of the second half of the steady blocks."""
    script: str | None = None
    """The training script's version as the run started: its name with its git commit
    (``+modified`` when the file differed from it) or the start of its hash."""


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
    samples = all(_samples_known(v) for v in (*views_b, *views_a))
    nb = names[0] if names else [r.meta.run_id for r in befores]
    na = names[1] if names else [r.meta.run_id for r in afters]
    runs_b = tuple(_facts(v, n, samples) for v, n in zip(views_b, nb, strict=True))
    runs_a = tuple(_facts(v, n, samples) for v, n in zip(views_a, na, strict=True))
    b, a = _merge(runs_b), _merge(runs_a)
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
    notes += _machine_notes(b, a) + _changes(runs_b, runs_a)
    notes += _ended_badly([*views_b, *views_a], [*nb, *na])
    median_b, median_a = b.summary.step_time_median_s, a.summary.step_time_median_s
    median_ratio = median_a / median_b if median_a and median_b else None
    resolved, still, new = _finding_changes(
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
        rows=_rows(runs_b, runs_a),
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
            + (f" (the change, if any, is close to the {min_effect:.0%} that counts)"
               if edge else "")
            + "; a quieter machine, or this one's own --run-noise "
            "(benchmarks/compare_reruns.py), needs fewer"
        )
    return f"{said} (trainmedic bench --runs {more}) would decide it"


def _ended_badly(views: Sequence[RunView], names: Sequence[str]) -> list[str]:
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


def _changes(b: Sequence[RunFacts], a: Sequence[RunFacts]) -> list[str]:
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


# --- throughput and its interval -------------------------------------------------------------


def _samples_known(view: RunView) -> bool:
    return view.summary.steps_steady > 0 and all(s.samples is not None for s in view.steady)


def _facts(view: RunView, name: str, samples: bool) -> RunFacts:
    s = view.summary
    spans = sorted(view.steady, key=lambda x: x.t_end)
    processes = view.concurrent_processes
    blocks = blocks_of(spans, samples, processes)
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
        usable_cores=view.usable_cores,
        steal_pct=view.cpu.steal_pct,
        throttled_share=view.cpu.throttled_share,
        foreign_gpu_processes=_foreign_gpu_processes(view),
        host=_env(view, "host", "hostname"),
        gpu_models=tuple(sorted({str(g.get("name")) for g in _gpus(view) if g.get("name")})),
        torch_version=_env(view, "torch", "version"),
        halves=halves(blocks),
        script=_script(view),
    )


def _script(view: RunView) -> str | None:
    found = view.record.meta.environment.get("script")
    if not isinstance(found, dict) or not found.get("path"):
        return None
    name = Path(str(found["path"])).name
    digest = f"sha256 {str(found['sha256'])[:12]}" if found.get("sha256") else ""
    if found.get("git_commit"):
        at = f"{name} at {str(found['git_commit'])[:10]}"
        # A file changed since the commit is told apart by its bytes.
        return f"{at}+modified ({digest})" if found.get("git_modified") and digest else at
    return f"{name} ({digest})" if digest else None


def _env(view: RunView, part: str, key: str) -> str | None:
    found = view.record.meta.environment.get(part)
    value = found.get(key) if isinstance(found, dict) else None
    return str(value) if value else None


def _gpus(view: RunView) -> list[dict[str, Any]]:
    gpu = view.record.meta.environment.get("gpu")
    devices = gpu.get("gpus") if isinstance(gpu, dict) else None
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


def _foreign_gpu_processes(view: RunView) -> int:
    """Processes not the job's seen on the job's GPUs."""
    jobs = view.pids
    indices = set(view.job_gpu_indices)
    return len({p.pid for g in view.record.gpu if g.index in indices
                for p in g.processes if p.pid not in jobs})  # fmt: skip


def _merge(runs: Sequence[RunFacts]) -> RunFacts:
    """One side's runs as one: its rate the mean of the runs' rates, its measures the
    means of theirs (the first run's summary stands for the step-time details)."""
    if len(runs) == 1:
        return runs[0]

    def mean_of(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None

    first = runs[0]
    rates = [r.rate for r in runs]
    return dataclasses.replace(
        first,
        name=f"{first.name} +{len(runs) - 1}",
        steady_steps=sum(r.steady_steps for r in runs),
        rate=None if None in rates else statistics.fmean([r for r in rates if r is not None]),
        blocks=tuple(b for r in runs for b in r.blocks),
        train_cpu_wait_share=mean_of([r.train_cpu_wait_share for r in runs]),
        others_wait_share=statistics.fmean(r.others_wait_share for r in runs),
        others_cpu_cores=mean_of([r.others_cpu_cores for r in runs]),
        gpu_sm_clock_mhz=mean_of([r.gpu_sm_clock_mhz for r in runs]),
        gpu_memory_used_max_gib=max((r.gpu_memory_used_max_gib for r in runs
                                     if r.gpu_memory_used_max_gib is not None), default=None),
        steal_pct=mean_of([r.steal_pct for r in runs]),
        throttled_share=mean_of([r.throttled_share for r in runs]),
        foreign_gpu_processes=max(r.foreign_gpu_processes for r in runs),
        halves=None,
    )  # fmt: skip


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


# --- side by side ---------------------------------------------------------------------------


def _rows(
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
