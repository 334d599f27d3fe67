"""Batch-size finder: the largest micro-batch that fits, with a safety margin.

:func:`find_batch_size` grows the batch (doubling) until a training step runs
out of memory, then bisects between the last size that fit and the first that
did not. Each size is tried with a real step (forward, backward and, when an
optimizer is given, its step: optimizer state takes memory too) and timed, so
the result also says the throughput at each size. The recommended micro-batch
keeps a safety margin below the largest that fit (memory varies from batch to
batch: sequence lengths, allocator fragmentation), and the accumulation steps
keep the user's effective batch exact.

The model's and optimizer's state are restored afterwards: trying sizes does
not train the model.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainmedic.errors import UsageError
from trainmedic.remedies.oom import free_memory, is_oom

DEFAULT_MARGIN = 0.1
"""Share kept free below the largest size that fit."""


@dataclass(frozen=True)
class SizeTrial:
    """One size tried.

    Attributes:
        size: samples in the batch.
        fits: the step completed.
        step_s: median time of a step, seconds (``None`` when it did not fit).
        samples_per_s: ``size / step_s``.
        peak_bytes: CUDA allocator peak of the step (``None`` on CPU).
    """

    size: int
    fits: bool
    step_s: float | None = None
    samples_per_s: float | None = None
    peak_bytes: int | None = None


@dataclass(frozen=True)
class BatchSizeResult:
    """What the finder found.

    Attributes:
        largest_fit: the largest size whose step completed.
        first_failure: the smallest size that ran out of memory (``None``: none did
            up to ``max_size``).
        micro_batch_size: the recommendation: ``largest_fit`` less the margin,
            rounded down to a divisor of ``effective_batch_size`` when one is given.
        accumulation_steps: micro-batches per optimizer step for ``effective_batch_size``.
        trials: every size tried, in order.
    """

    largest_fit: int
    first_failure: int | None
    micro_batch_size: int
    accumulation_steps: int
    effective_batch_size: int | None
    margin: float
    trials: tuple[SizeTrial, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "tune-batch-size",
            "schema_version": 1,
            "largest_fit": self.largest_fit,
            "first_failure": self.first_failure,
            "micro_batch_size": self.micro_batch_size,
            "accumulation_steps": self.accumulation_steps,
            "effective_batch_size": self.effective_batch_size,
            "margin": self.margin,
            "trials": [t.__dict__ for t in self.trials],
        }


def plan_accumulation(fit: int, effective: int | None) -> tuple[int, int]:
    """(micro-batch, accumulation steps) with ``micro <= fit`` and ``micro * steps == effective``
    when possible; without an effective batch, ``(fit, 1)``."""
    if effective is None:
        return fit, 1
    if fit >= effective:
        return effective, 1
    # The largest divisor of the effective batch that fits keeps it exact; a poor
    # divisor (under half the fitting size) costs more steps than an inexact batch.
    divisor = next(m for m in range(fit, 0, -1) if effective % m == 0)
    if divisor * 2 >= fit:
        return divisor, effective // divisor
    return fit, -(-effective // fit)


def find_batch_size(
    model: Any,
    make_batch: Callable[[int], Any],
    *,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    optimizer: Any | None = None,
    start: int = 1,
    max_size: int = 65536,
    margin: float = DEFAULT_MARGIN,
    effective_batch_size: int | None = None,
    repeats: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    free: Callable[[], None] = free_memory,
) -> BatchSizeResult:
    """Find the largest batch a training step of ``model`` fits in memory.

    Args:
        model: a ``torch.nn.Module`` (on its device).
        make_batch: ``n -> batch`` on the model's device; e.g. ``lambda n:
            sample.unsqueeze(0).expand(n, *sample.shape).clone()``.
        loss_fn: ``(model, batch) -> scalar loss``; default: ``model(batch).float().mean()``.
        optimizer: stepped in each trial when given (its state is memory too).
        start / max_size: the first size tried and the largest ever tried.
        margin: share kept free: the recommendation is ``floor(largest_fit * (1 - margin))``.
        effective_batch_size: the batch the user trains with (micro-batch x accumulation).
        repeats: timed steps per size (after one untimed warm-up step).
        free: releases what a failed size held (default: garbage collection, then
            CUDA's cached blocks).
    """
    if not 0.0 <= margin < 1.0:
        raise UsageError(f"margin must be within [0, 1), got {margin}")
    if start < 1 or max_size < start:
        raise UsageError(f"need 1 <= start <= max_size, got start={start}, max_size={max_size}")
    if effective_batch_size is not None and effective_batch_size < 1:
        raise UsageError(f"effective_batch_size must be >= 1, got {effective_batch_size}")
    loss_fn = loss_fn or _default_loss
    # Saved on the host: a copy on the device would take the memory being measured.
    # Without an optimizer the weights never change, only gradients appear.
    saved_model = _to_host(model.state_dict()) if optimizer is not None else None
    saved_opt = _to_host(optimizer.state_dict()) if optimizer is not None else None
    trials: list[SizeTrial] = []
    try:
        good, bad = 0, None
        size = start
        while True:  # grow
            trial = _try(model, make_batch, loss_fn, optimizer, size, repeats, clock, free)
            trials.append(trial)
            if not trial.fits:
                bad = size
                break
            good = size
            if size >= max_size:
                break
            size = min(max_size, size * 2)
        while bad is not None and bad - good > 1:  # bisect
            mid = (good + bad) // 2
            trial = _try(model, make_batch, loss_fn, optimizer, mid, repeats, clock, free)
            trials.append(trial)
            if trial.fits:
                good = mid
            else:
                bad = mid
    finally:
        if saved_model is not None:
            model.load_state_dict(saved_model)
        if optimizer is not None and saved_opt is not None:
            optimizer.load_state_dict(saved_opt)
            optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        free()
    if good == 0:
        raise UsageError(f"a batch of {start} sample(s) does not fit in memory")
    # Only sizes that ran out of memory need a margin below them: a search that
    # stopped at max_size found no limit.
    fit = good if bad is None else max(1, int(good * (1.0 - margin)))
    micro, steps = plan_accumulation(fit, effective_batch_size)
    return BatchSizeResult(
        largest_fit=good,
        first_failure=bad,
        micro_batch_size=micro,
        accumulation_steps=steps,
        effective_batch_size=effective_batch_size,
        margin=margin,
        trials=tuple(trials),
    )


def _to_host(value: Any) -> Any:
    """A deep copy with every tensor copied to host memory."""
    if hasattr(value, "detach") and hasattr(value, "to"):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return copy.deepcopy(value)


def _default_loss(model: Any, batch: Any) -> Any:
    out = model(batch)
    return out.float().mean()


def _cuda_sync_and_peak(model: Any) -> tuple[Any, int | None]:
    import torch

    try:
        device = next(model.parameters()).device
    except StopIteration:
        return None, None
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return device, int(torch.cuda.max_memory_allocated(device))


def _try(
    model: Any,
    make_batch: Callable[[int], Any],
    loss_fn: Callable[[Any, Any], Any],
    optimizer: Any | None,
    size: int,
    repeats: int,
    clock: Callable[[], float],
    free: Callable[[], None],
) -> SizeTrial:
    times: list[float] = []
    ok = True
    try:
        device, _ = _cuda_sync_and_peak(model)
        if device is not None:
            import torch

            torch.cuda.reset_peak_memory_stats(device)
        for i in range(1 + max(1, repeats)):
            t0 = clock()
            batch = make_batch(size)
            loss = loss_fn(model, batch)
            loss.backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
            del batch, loss
            _cuda_sync_and_peak(model)
            if i > 0:
                times.append(clock() - t0)
    except Exception as exc:
        if not is_oom(exc):
            raise
        ok = False
    if not ok:
        model.zero_grad(set_to_none=True)
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        free()
        return SizeTrial(size, False)
    _, peak = _cuda_sync_and_peak(model)
    times.sort()
    step = times[len(times) // 2]
    return SizeTrial(size, True, step, size / step if step > 0 else None, peak)
