"""The DataLoader tuner's search: spend the time budget on the axis that matters.

After the dataset is profiled (:func:`~trainmedic.remedies.loader_measure.LoaderBench.profile`),
the search measures the current settings, then walks one axis at a time,
doubling while the rate improves by at least :data:`MIN_GAIN` and bisecting
between the best level and the first that did not improve:

1. **worker processes** — up to the usable cores for CPU-bound data; for
   latency-bound data that cannot use threads (an iterable dataset) up to
   what memory and ``/dev/shm`` allow, since waiting does not need cores;
2. **threads per worker** (map-style data that is latency-bound or mixed) —
   samples in flight are what hides latency, and threads are cheaper than
   processes; bounded by :data:`~trainmedic.remedies.limits.MAX_IN_FLIGHT`;
3. ``prefetch_factor`` 4 and 8 at the best setting; ``pin_memory`` when CUDA
   is present (pinned batches copy to the GPU asynchronously);
4. the rest of the budget re-measures the current and the best settings in
   turn, so their ratio — the speed-up, with a bootstrap confidence interval
   over all their segments — is not an artefact of when each was measured.

``persistent_workers`` is recommended with workers (it saves the measured
start-up at every epoch) but not measured: one epoch per trial cannot show it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from trainmedic.remedies.limits import MAX_IN_FLIGHT, LoaderLimits
from trainmedic.remedies.loader_measure import DatasetProfile, LoaderSettings, Trial
from trainmedic.remedies.stats import bootstrap_ratio_ci

MIN_GAIN = 0.05
"""A level must be this much faster than the best so far to count as better."""
SEGMENTS = 3
"""Rates measured per trial."""
PROFILE_SHARE = 0.1
"""Share of the budget spent profiling the dataset."""
CONFIRM_SHARE = 0.2
"""Share of the budget kept to re-measure the current and the best settings."""
MAX_WORKERS = 64
PATIENCE = 2
"""Levels in a row that do not pay before an axis stops doubling."""


class Measure(Protocol):
    def __call__(
        self,
        settings: LoaderSettings,
        window_s: float,
        segments: int,
        deadline: float | None = None,
        phase: str = "",
    ) -> Trial: ...


@dataclass(frozen=True)
class TuneResult:
    """What the tuner found.

    Attributes:
        baseline: the current settings, measured (segments of every measurement pooled).
        best: the best settings, measured likewise; ``baseline`` when nothing beat it.
        recommended: ``best``'s settings plus ``persistent_workers`` when it has workers.
        speedup: mean rate of ``best`` over ``baseline``'s.
        speedup_ci: 95 % bootstrap interval of the speed-up (``None``: too few segments).
        trials: every measurement, in order.
    """

    baseline: Trial
    best: Trial
    recommended: LoaderSettings
    speedup: float
    speedup_ci: tuple[float, float] | None
    trials: tuple[Trial, ...]
    profile: DatasetProfile
    limits: LoaderLimits
    batch_size: int
    budget_s: float
    elapsed_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    dataset_type: str | None = None
    dataset_code: str | None = None
    step_s: float = 0.0

    @property
    def significant(self) -> bool:
        """The speed-up's interval lies above 1: the best settings are really faster."""
        return (
            self.best.settings != self.baseline.settings
            and self.speedup_ci is not None
            and self.speedup_ci[0] > 1.0
        )

    def code(self, dataset: str = "dataset") -> str:
        """The recommended settings as a line to paste."""
        s = self.recommended.normalized()
        if s.threads > 1:
            dataset = f"trainmedic.remedies.ThreadedFetch({dataset}, threads={s.threads})"
        args = [dataset, f"batch_size={self.batch_size}", f"num_workers={s.num_workers}"]
        if s.num_workers:
            args += [f"prefetch_factor={s.prefetch}", f"persistent_workers={s.persistent_workers}"]
        if s.pin_memory:
            args.append("pin_memory=True")
        return f"DataLoader({', '.join(args)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "tune-dataloader",
            "schema_version": 1,
            "best": self.recommended.to_dict(),
            "speedup": round(self.speedup, 4),
            "speedup_ci": None
            if self.speedup_ci is None
            else [round(self.speedup_ci[0], 4), round(self.speedup_ci[1], 4)],
            "significant": self.significant,
            "baseline": self.baseline.to_dict(),
            "best_trial": self.best.to_dict(),
            "code": self.code(),
            "batch_size": self.batch_size,
            "profile": self.profile.to_dict(),
            "limits": self.limits.to_dict(),
            "budget_s": self.budget_s,
            "elapsed_s": round(self.elapsed_s, 3),
            "trials": [t.to_dict() for t in self.trials],
            "notes": list(self.notes),
            "dataset_type": self.dataset_type,
            "dataset_code": self.dataset_code,
            "step_s": self.step_s,
        }


class Search:
    """One tuning session over a measuring function (a seam: tests pass a model).

    Args:
        measure: measures one configuration.
        profile / limits: the dataset and the machine.
        baseline: the current settings.
        iterable: the dataset is iterable-style (no threads, no index control).
        cuda: pinned memory is worth measuring.
        budget_s: seconds for the search, profiling excluded.
        batch_size: samples per batch (window sizing).
        step_s: the training step's time per batch the measurements include (0: none).
    """

    def __init__(
        self,
        measure: Measure,
        profile: DatasetProfile,
        limits: LoaderLimits,
        baseline: LoaderSettings,
        *,
        iterable: bool,
        cuda: bool,
        budget_s: float,
        batch_size: int,
        clock: Callable[[], float] = time.perf_counter,
        log: Callable[[str], None] | None = None,
        step_s: float = 0.0,
    ) -> None:
        self.measure = measure
        self.step_s = step_s
        self.profile = profile
        self.limits = limits
        self.baseline = baseline.normalized()
        self.iterable = iterable
        self.cuda = cuda
        self.budget_s = budget_s
        self.batch_size = batch_size
        self.clock = clock
        self.log = log or (lambda line: None)
        self.started = clock()
        self.deadline = self.started + budget_s
        self.trials: list[Trial] = []
        self.by_settings: dict[LoaderSettings, Trial] = {}
        self.notes: list[str] = []
        self.window_s = self._window()
        self.worker_rss: int | None = None
        self.improved = False
        self.best: Trial | None = None

    # --- budget -----------------------------------------------------------------------------------

    def _window(self, rate: float | None = None) -> float:
        """Seconds per segment: the search's share of the budget spread over the trials
        it expects, but at least 1.5 batches at ``rate`` (samples/s) so that a
        segment never measures a fraction of a batch."""
        search_s = self.budget_s * (1.0 - CONFIRM_SHARE)
        expected = 6 if self.profile.kind == "cpu" else 10
        window = search_s / (expected * (SEGMENTS + 1))
        if rate is None or rate <= 0:
            rate = max(1, self.baseline.in_flight) / max(self.profile.sample_s, 1e-6)
        batch_s = self.batch_size / rate
        return max(0.05, min(5.0, search_s / 8, max(window, 1.5 * batch_s)))

    def _remaining(self) -> float:
        return self.deadline - self.clock()

    def _trial_cost(self) -> float:
        startups = [t.startup_s for t in self.trials if t.startup_s is not None]
        startup = max(startups) if startups else 0.5
        return startup + (SEGMENTS + 0.5) * self.window_s

    def _affordable(self, reserve: float) -> bool:
        # The confirmation's reserve is needed only once something beat the baseline.
        held = reserve if self.improved else 0.0
        return self._remaining() - held >= self._trial_cost()

    # --- measuring --------------------------------------------------------------------------------

    def _run(self, settings: LoaderSettings, phase: str) -> Trial:
        settings = settings.normalized()
        window = self.window_s
        if self.best is not None and self.best.rate > 0:
            # More samples in flight should come faster: a shorter window still
            # holds enough batches, and the budget reaches further.
            ratio = max(1.0, settings.in_flight / max(1, self.best.settings.in_flight))
            window = self._window(self.best.rate * ratio)
        trial = self.measure(settings, window, SEGMENTS, self.deadline, phase)
        self.trials.append(trial)
        if trial.worker_rss_bytes and self.worker_rss is None:
            self.worker_rss = trial.worker_rss_bytes
        old = self.by_settings.get(settings)
        pooled = trial if old is None or old.error else old.pooled(trial)
        if trial.error is None:
            self.by_settings[settings] = pooled
        elif old is None:
            self.by_settings[settings] = trial
        self.log(
            f"  {settings.label():<42} "
            + (f"failed: {trial.error}" if trial.error else f"{trial.rate:10.1f} samples/s")
        )
        return self.by_settings[settings]

    def _better(self, candidate: Trial, best: Trial) -> bool:
        return candidate.error is None and candidate.rate > best.rate * (1.0 + MIN_GAIN)

    def _axis(
        self,
        best: Trial,
        make: Callable[[int], LoaderSettings],
        start: int,
        cap: int,
        phase: str,
        reserve: float,
    ) -> Trial:
        """Double from ``start`` while it pays, then bisect below the first level that did not."""
        current = self._level(best.settings, phase)
        level = start
        while level <= current:  # only more parallelism than the script has
            level *= 2
        level = min(level, cap) if current < cap else cap + 1
        upper: int | None = None
        misses = 0
        if phase == "workers":
            cap = self._memory_cap(cap)
        # One level that does not pay is not the end: a single worker often only
        # matches the main process, the gain comes with the second.
        while level <= cap and self._affordable(reserve):
            if phase == "workers" and level > self._memory_cap(cap):
                break  # the workers measured so far say memory holds no more
            trial = self._run(make(level), phase)
            if self._better(trial, best):
                best, current, upper, misses = trial, level, None, 0
                self._improved(best)
            else:
                upper = level if upper is None else upper
                misses += 1
                if misses >= PATIENCE:
                    break
            if level >= cap:
                break
            level = min(cap, level * 2)
        if upper is not None:
            low = current
            while upper - low > 1 and self._affordable(reserve):
                mid = (low + upper) // 2
                trial = self._run(make(mid), phase)
                if self._better(trial, best):
                    best, low = trial, mid
                    self._improved(best)
                else:
                    upper = mid
        return best

    def _improved(self, best: Trial) -> None:
        self.improved = True
        self.best = best
        self.window_s = self._window(best.rate)

    @staticmethod
    def _level(settings: LoaderSettings, phase: str) -> int:
        return settings.num_workers if phase == "workers" else settings.threads

    # --- the search ------------------------------------------------------------------------

    def run(self) -> tuple[Trial, Trial, LoaderSettings]:
        reserve = self.budget_s * CONFIRM_SHARE
        baseline = self._run(self.baseline, "baseline")
        best = baseline
        if baseline.error is None:
            self.window_s = self._window(baseline.rate)
            self.best = baseline
        kind = self.profile.kind
        self.log(
            f"dataset: {kind}-bound ({self.profile.cpu_share:.0%} CPU while reading, "
            f"{self.profile.sample_s * 1000:.2f} ms per sample); usable cores "
            f"{self.limits.usable_cores:g}"
        )
        threads_ok = not self.iterable and kind != "cpu"
        worker_cap = self.limits.cpu_workers
        if kind != "cpu" and not threads_ok:
            worker_cap = MAX_WORKERS  # waiting needs no core
        bound = self.limits.max_workers(None, self.profile.batch_bytes, 2)
        if bound is not None and bound < worker_cap:
            self.notes.append(f"/dev/shm holds the batches of at most {bound} workers")
            worker_cap = bound
        if threads_ok and kind == "latency":
            # Waiting is hidden by samples in flight: threads first, in one worker so
            # that loading overlaps training; then processes for the CPU part.
            best = self._threads(best, reserve)
            best = self._workers(best, worker_cap, reserve)
        else:
            best = self._workers(best, worker_cap, reserve)
            if threads_ok:
                best = self._threads(best, reserve)
        if best.settings.num_workers:
            for factor in (4, 8):
                if not self._affordable(reserve):
                    break
                trial = self._run(replace(best.settings, prefetch_factor=factor), "prefetch")
                if not self._better(trial, best):
                    break
                best = trial
                self._improved(best)
        if self.cuda and not best.settings.pin_memory and self._affordable(reserve):
            trial = self._run(replace(best.settings, pin_memory=True), "pin_memory")
            if self._better(trial, best):
                best = trial
                self._improved(best)
        elif not self.cuda:
            self.notes.append(
                "pin_memory not measured: no CUDA device (it only helps copies to one)"
            )
        if self.step_s == 0 and kind != "latency":
            self.notes.append(
                "measured the loader alone: give your training step's time per batch "
                "(--step-ms, step_s=) to compare settings beside training, which on few "
                "cores often favours one worker fewer"
            )
        baseline, best = self._confirm(self.by_settings[self.baseline], best)
        recommended = best.settings
        if recommended.num_workers:
            recommended = replace(recommended, persistent_workers=True)
            if best.startup_s is not None:
                self.notes.append(
                    f"persistent_workers=True saves the {best.startup_s:.2f} s start-up of "
                    "the workers at every epoch (keep it off if the script changes the "
                    "dataset between epochs: persistent workers keep their copy)"
                )
        return baseline, best, recommended

    def _workers(self, best: Trial, cap: int, reserve: float) -> Trial:
        base = best.settings
        return self._axis(best, lambda w: replace(base, num_workers=w), 1, cap, "workers", reserve)

    def _memory_cap(self, cap: int) -> int:
        """``cap``, lowered to the workers half the available memory holds, once a
        worker's own memory (USS) was measured."""
        bound = self.limits.max_workers(self.worker_rss, None, 2)
        if bound is None or bound >= cap:
            return cap
        note = f"memory holds at most {bound} workers ({self.worker_rss or 0} bytes each)"
        if note not in self.notes:
            self.notes.append(note)
        return bound

    def _threads(self, best: Trial, reserve: float) -> Trial:
        workers = max(1, best.settings.num_workers)
        base = replace(best.settings, num_workers=workers)
        cap = max(1, MAX_IN_FLIGHT // workers)
        return self._axis(best, lambda t: replace(base, threads=t), 2, cap, "threads", reserve)

    def _confirm(self, baseline: Trial, best: Trial) -> tuple[Trial, Trial]:
        """Re-measure the current and the best settings in turn while the budget lasts."""
        if best.settings == baseline.settings:
            return baseline, best
        rounds = 0
        while rounds < 4 and self._remaining() >= 2 * self._trial_cost():
            baseline = self._run(baseline.settings, "confirm")
            best = self._run(best.settings, "confirm")
            rounds += 1
        return baseline, best


def summarize(
    search: Search, baseline: Trial, best: Trial, recommended: LoaderSettings, elapsed_s: float
) -> TuneResult:
    """The search's outcome as a :class:`TuneResult`."""
    if best.error is not None or best.rate <= baseline.rate:
        best = baseline
        recommended = baseline.settings
    speedup = best.rate / baseline.rate if baseline.rate > 0 else float("inf")
    ci = None
    if best.settings == baseline.settings:
        ci = (1.0, 1.0)
    elif baseline.rate > 0:
        ci = bootstrap_ratio_ci(best.rates, baseline.rates)
    return TuneResult(
        baseline=baseline,
        best=best,
        recommended=recommended,
        speedup=speedup,
        speedup_ci=ci,
        trials=tuple(search.trials),
        profile=search.profile,
        limits=search.limits,
        batch_size=search.batch_size,
        budget_s=search.budget_s,
        elapsed_s=elapsed_s,
        notes=tuple(search.notes),
    )
