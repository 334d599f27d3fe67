"""Measuring a DataLoader configuration: samples/s in repeated segments, start-up, memory.

:class:`LoaderBench` builds DataLoaders over the user's dataset with the
settings under test and measures them the same way: start-up (``iter()`` to
the first batch, paid at every epoch unless workers persist), then the batches
already prefetched are skipped, then ``segments`` windows of ``window_s``
seconds each give one rate each. Indices come from one shuffled stream that
continues from trial to trial, so no trial re-reads what an earlier one left
in the page cache while the dataset is large enough.

:func:`profile_dataset` reads samples in this process and compares CPU time
with wall time: a dataset that computes (decode, augment) is CPU-bound and
gains from worker processes up to the usable cores; one that waits (disk,
network) is latency-bound and gains from samples in flight, which cores do
not bound.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from trainmedic.remedies.stats import mean, mean_ci

CPU_BOUND_SHARE = 0.7
"""Per-sample CPU time over wall time from which loading is CPU-bound."""
LATENCY_BOUND_SHARE = 0.3
"""... and up to which it is latency-bound (between the two: mixed)."""


@dataclass(frozen=True)
class LoaderSettings:
    """The settings the tuner varies.

    Attributes:
        threads: threads fetching each batch's samples
            (:class:`~trainmedic.remedies.threaded.ThreadedFetch`); 1 = none.
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    threads: int = 1

    def normalized(self) -> LoaderSettings:
        """The settings as DataLoader takes them (no prefetch or persistence without workers)."""
        if self.num_workers == 0:
            return replace(self, prefetch_factor=None, persistent_workers=False)
        return replace(self, prefetch_factor=self.prefetch_factor or 2)

    @property
    def prefetch(self) -> int:
        return self.prefetch_factor or 2

    @property
    def in_flight(self) -> int:
        """Samples fetched at once."""
        return max(1, self.num_workers) * self.threads

    def label(self) -> str:
        parts = [f"workers={self.num_workers}"]
        if self.threads > 1:
            parts.append(f"threads={self.threads}")
        if self.num_workers:
            parts.append(f"prefetch={self.prefetch}")
        if self.pin_memory:
            parts.append("pin")
        if self.persistent_workers:
            parts.append("persistent")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        s = self.normalized()
        return {
            "num_workers": s.num_workers,
            "prefetch_factor": s.prefetch_factor,
            "persistent_workers": s.persistent_workers,
            "pin_memory": s.pin_memory,
            "threads": s.threads,
        }


@dataclass(frozen=True)
class Trial:
    """One configuration measured.

    Attributes:
        rates: samples/s of each segment.
        startup_s: ``iter()`` to the first batch, seconds.
        worker_rss_bytes: resident memory of one worker process (mean), when measured.
        error: why the configuration failed (workers could not start, ...).
    """

    settings: LoaderSettings
    rates: tuple[float, ...] = ()
    startup_s: float | None = None
    worker_rss_bytes: int | None = None
    error: str | None = None
    phase: str = ""

    @property
    def rate(self) -> float:
        """Mean samples/s (0 when it failed)."""
        return mean(self.rates) if self.error is None else 0.0

    @property
    def rate_ci(self) -> tuple[float, float] | None:
        return mean_ci(self.rates) if self.error is None else None

    def pooled(self, other: Trial) -> Trial:
        """This trial with ``other``'s segments (same settings, measured again) added."""
        return replace(self, rates=self.rates + other.rates)

    def to_dict(self) -> dict[str, Any]:
        ci = self.rate_ci
        return {
            "settings": self.settings.to_dict(),
            "samples_per_s": round(self.rate, 3),
            "samples_per_s_ci": None if ci is None else [round(ci[0], 3), round(ci[1], 3)],
            "segments": len(self.rates),
            "startup_s": None if self.startup_s is None else round(self.startup_s, 4),
            "worker_rss_bytes": self.worker_rss_bytes,
            "error": self.error,
            "phase": self.phase,
        }


@dataclass(frozen=True)
class DatasetProfile:
    """How one sample is read, measured in this process.

    Attributes:
        sample_s: wall time per sample, seconds.
        cpu_share: CPU time over wall time while reading (all threads of the process).
        batch_bytes: bytes of one collated batch (tensors), when measurable.
        samples: samples read to measure.
    """

    sample_s: float
    cpu_share: float
    batch_bytes: int | None
    samples: int
    kind: str = field(init=False)

    def __post_init__(self) -> None:
        if self.cpu_share >= CPU_BOUND_SHARE:
            kind = "cpu"
        elif self.cpu_share <= LATENCY_BOUND_SHARE:
            kind = "latency"
        else:
            kind = "mixed"
        object.__setattr__(self, "kind", kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sample_s": round(self.sample_s, 6),
            "cpu_share": round(self.cpu_share, 3),
            "batch_bytes": self.batch_bytes,
            "samples": self.samples,
        }


def tensor_bytes(value: Any, depth: int = 0) -> int:
    """Bytes of the tensors in a (nested) batch."""
    if hasattr(value, "element_size") and hasattr(value, "nelement"):
        return int(value.element_size() * value.nelement())
    if depth > 6:
        return 0
    if isinstance(value, dict):
        return sum(tensor_bytes(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v, depth + 1) for v in value)
    return 0


class IndexStream:
    """Batches of indices from one shuffled, endless stream (a DataLoader ``batch_sampler``)."""

    def __init__(self, size: int, batch_size: int, seed: int = 0) -> None:
        self.size = size
        self.batch_size = batch_size
        self._rng = random.Random(seed)
        self._order: list[int] = []
        self._cursor = 0

    def _next_index(self) -> int:
        if self._cursor >= len(self._order):
            self._order = list(range(self.size))
            self._rng.shuffle(self._order)
            self._cursor = 0
        self._cursor += 1
        return self._order[self._cursor - 1]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield [self._next_index() for _ in range(self.batch_size)]


class LoaderBench:
    """Measures DataLoader settings over one dataset.

    Args:
        dataset: a map-style or iterable dataset.
        batch_size: samples per batch.
        loader_kwargs: the user's other DataLoader arguments that are kept
            (``collate_fn``, ``multiprocessing_context``, ``worker_init_fn``, ...).
        step_s: the training step's time per batch, seconds: after each batch the
            measuring process stays busy on its CPU that long, as training keeps it,
            so loading that overlaps training — and competes with it for cores — is
            measured as it will run. 0: the loader alone.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        loader_kwargs: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
        step_s: float = 0.0,
    ) -> None:
        import torch.utils.data

        self.dataset = dataset
        self.batch_size = batch_size
        self.loader_kwargs = dict(loader_kwargs or {})
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.step_s = max(0.0, step_s)
        self.iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self.stream = None if self.iterable else IndexStream(len(dataset), batch_size)

    # --- the dataset alone ------------------------------------------------------------------------

    def profile(
        self, budget_s: float, min_samples: int = 3, max_samples: int = 256
    ) -> DatasetProfile:
        """Read samples in this process for about ``budget_s`` seconds."""
        import torch.utils.data

        collate = self.loader_kwargs.get("collate_fn") or torch.utils.data.default_collate
        samples: list[Any] = []
        wall0, cpu0, queued0 = self.clock(), self.cpu_clock(), run_queue_wait_s()
        source = iter(self.dataset) if self.iterable else None
        while len(samples) < max_samples:
            if source is not None:
                try:
                    samples.append(next(source))
                except StopIteration:
                    break
            else:
                assert self.stream is not None
                samples.append(self.dataset[self.stream._next_index()])
            if len(samples) >= min_samples and self.clock() - wall0 >= budget_s:
                break
        wall, cpu = self.clock() - wall0, self.cpu_clock() - cpu0
        queued1 = run_queue_wait_s()
        if queued0 is not None and queued1 is not None:
            # Time spent runnable but waiting for a CPU (others' load on a shared
            # machine) is neither computing nor waiting for data: leave it out.
            wall = max(cpu, wall - (queued1 - queued0))
        n = max(1, len(samples))
        batch_bytes = None
        try:
            batch = collate(samples[: self.batch_size])
            per_sample = tensor_bytes(batch) / max(1, min(len(samples), self.batch_size))
            batch_bytes = int(per_sample * self.batch_size) or None
        except Exception:
            pass
        return DatasetProfile(
            sample_s=wall / n,
            cpu_share=min(1.0, cpu / wall) if wall > 0 else 1.0,
            batch_bytes=batch_bytes,
            samples=len(samples),
        )

    # --- a configuration --------------------------------------------------------------------------

    def _train_step(self) -> None:
        """Keep this process's CPU busy for ``step_s``, as a training step would."""
        end = self.clock() + self.step_s
        while self.clock() < end:
            pass

    def _loader(self, settings: LoaderSettings) -> Any:
        import torch.utils.data

        from trainmedic.remedies.threaded import ThreadedFetch

        s = settings.normalized()
        dataset = self.dataset
        if s.threads > 1 and not self.iterable:
            dataset = ThreadedFetch(dataset, s.threads)
        kwargs = dict(self.loader_kwargs)
        kwargs.update(
            num_workers=s.num_workers,
            pin_memory=s.pin_memory,
            persistent_workers=False,  # each trial is one epoch; start-up is measured apart
        )
        if s.num_workers:
            kwargs["prefetch_factor"] = s.prefetch
        if self.iterable:
            return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, **kwargs)
        return torch.utils.data.DataLoader(dataset, batch_sampler=self.stream, **kwargs)

    def measure(
        self,
        settings: LoaderSettings,
        window_s: float,
        segments: int,
        deadline: float | None = None,
        phase: str = "",
    ) -> Trial:
        """Measure ``settings``: start-up, then ``segments`` rates over ``window_s`` each."""
        from trainmedic.remedies.batches import batch_size as rows_of

        clock = self.clock
        iterator: Any = None
        rates: list[float] = []
        startup: float | None = None
        rss: int | None = None
        try:
            loader = self._loader(settings)
            t0 = clock()
            iterator = iter(loader)
            next(iterator)
            startup = clock() - t0
            s = settings.normalized()
            for _ in range(s.num_workers * s.prefetch):  # already fetched during start-up
                next(iterator)
            for _ in range(max(1, segments)):
                start, rows = clock(), 0
                while True:
                    rows += rows_of(next(iterator)) or self.batch_size
                    if self.step_s:
                        self._train_step()
                    elapsed = clock() - start
                    if elapsed >= window_s:
                        break
                    if deadline is not None and clock() >= deadline and rows:
                        break
                rates.append(rows / elapsed if elapsed > 0 else 0.0)
                if rss is None and s.num_workers:
                    rss = _worker_uss(iterator)
                if deadline is not None and clock() >= deadline:
                    break
        except StopIteration:
            if not rates:
                return Trial(settings, startup_s=startup, error="the dataset ended", phase=phase)
        except Exception as exc:
            return Trial(
                settings,
                startup_s=startup,
                error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                phase=phase,
            )
        finally:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                with contextlib.suppress(Exception):
                    shutdown()
            del iterator
        return Trial(settings, tuple(rates), startup, rss, phase=phase)


def run_queue_wait_s() -> float | None:
    """Seconds this process's threads have waited for a CPU while runnable
    (``/proc/self/task/*/schedstat``, second field); ``None`` where unreadable."""
    import os

    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _worker_uss(iterator: Any) -> int | None:
    """Mean memory of the iterator's worker processes held by each alone (USS: pages
    shared with the parent by fork would count once per worker in RSS), bytes."""
    try:
        from trainmedic.host import ps

        pids = [w.pid for w in getattr(iterator, "_workers", []) if w.pid is not None]
        sizes = [ps.Process(pid).memory_full_info().uss for pid in pids]
    except Exception:
        return None
    return int(sum(sizes) / len(sizes)) if sizes else None
