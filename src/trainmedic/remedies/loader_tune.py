"""``tune_dataloader``: find faster DataLoader settings for the user's dataset, with proof.

It accepts a Dataset, a DataLoader (whose settings are the current ones and
whose ``collate_fn``, ``worker_init_fn`` and ``multiprocessing_context`` are
kept), or a factory returning either. See :mod:`.loader_search` for the
search and :mod:`.loader_measure` for the measurements.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from trainmedic.codehash import code_of
from trainmedic.errors import UsageError
from trainmedic.remedies.limits import LoaderLimits, read_limits
from trainmedic.remedies.loader_measure import LoaderBench, LoaderSettings
from trainmedic.remedies.loader_search import PROFILE_SHARE, Search, TuneResult, summarize

DEFAULT_BATCH_SIZE = 32
DEFAULT_BUDGET_S = 60.0
MIN_BUDGET_S = 2.0
_KEPT = ("collate_fn", "worker_init_fn", "multiprocessing_context", "generator", "timeout")


def _source(obj: Any, batch_size: int | None) -> tuple[Any, int, LoaderSettings, dict[str, Any]]:
    """(dataset, batch size, current settings, kept DataLoader arguments) of ``obj``."""
    import torch.utils.data

    data = torch.utils.data
    if (
        callable(obj)
        and not isinstance(obj, (data.Dataset, data.DataLoader))
        and not hasattr(obj, "__getitem__")
        and not hasattr(obj, "__iter__")
    ):
        obj = obj()
    if isinstance(obj, torch.utils.data.DataLoader):
        if obj.batch_size is None and batch_size is None:
            raise UsageError(
                "the DataLoader has no batch_size (a batch_sampler or batch_size=None): "
                "give --batch-size"
            )
        kept = {k: getattr(obj, k) for k in _KEPT if getattr(obj, k, None) is not None}
        if kept.get("timeout") == 0:
            kept.pop("timeout")
        current = LoaderSettings(
            num_workers=int(obj.num_workers),
            prefetch_factor=obj.prefetch_factor if obj.num_workers else None,
            persistent_workers=bool(obj.persistent_workers),
            pin_memory=bool(obj.pin_memory),
        )
        return obj.dataset, int(batch_size or obj.batch_size or 1), current, kept
    is_map = hasattr(obj, "__getitem__") and hasattr(obj, "__len__")
    if not is_map and not isinstance(obj, torch.utils.data.IterableDataset):
        raise UsageError(
            "expected a Dataset or a DataLoader, got "
            f"{type(obj).__module__}.{type(obj).__qualname__}"
        )
    if is_map and len(obj) == 0:
        raise UsageError("the dataset is empty")
    return obj, int(batch_size or DEFAULT_BATCH_SIZE), LoaderSettings(), {}


def tune_dataloader(
    source: Any,
    *,
    batch_size: int | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    limits: LoaderLimits | None = None,
    cuda: bool | None = None,
    step_s: float = 0.0,
    log: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TuneResult:
    """Measure DataLoader settings for ``source`` within ``budget_s`` seconds.

    Args:
        source: a Dataset, a DataLoader, or a callable returning one.
        batch_size: samples per batch (default: the DataLoader's, else 32).
        budget_s: seconds to spend, profiling included.
        limits: the machine's limits (default: read now).
        cuda: whether to measure ``pin_memory`` (default: a CUDA device is present).
        step_s: the training step's time per batch, seconds (``compute`` of the run's
            steps, say): each measurement keeps this process busy that long per batch,
            so the settings are compared as they will run beside training. 0 (the
            default) measures the loader alone, which favours workers on every core.
        log: receives progress lines.

    Returns:
        a :class:`~trainmedic.remedies.loader_search.TuneResult`; ``.code()`` is the line
        to paste, ``.speedup`` / ``.speedup_ci`` the proof.
    """
    if budget_s < MIN_BUDGET_S:
        raise UsageError(f"budget must be at least {MIN_BUDGET_S:g} s, got {budget_s:g}")
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"batch size must be >= 1, got {batch_size}")
    started = clock()
    dataset, size, current, kept = _source(source, batch_size)
    if cuda is None:
        import torch

        cuda = bool(torch.cuda.is_available())
    if step_s < 0:
        raise UsageError(f"step time must be >= 0, got {step_s:g}")
    bench = LoaderBench(dataset, size, kept, clock=clock, step_s=step_s)
    profile = bench.profile(max(0.5, budget_s * PROFILE_SHARE))
    limits = limits or read_limits()
    search = Search(
        bench.measure,
        profile,
        limits,
        current,
        iterable=bench.iterable,
        cuda=cuda,
        budget_s=max(1.0, budget_s - (clock() - started)),
        batch_size=size,
        clock=clock,
        log=log,
        step_s=step_s,
    )
    baseline, best, recommended = search.run()
    result = summarize(search, baseline, best, recommended, clock() - started)
    kind = type(dataset)
    return replace(
        result,
        dataset_type=f"{kind.__module__}.{kind.__qualname__}",
        dataset_code=code_of(dataset),
        step_s=step_s,
    )
