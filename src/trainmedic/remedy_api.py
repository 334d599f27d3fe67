"""What a training script reads to follow the remedies of ``trainmedic run``.

After a failure the supervisor restarts the job with environment variables
that describe a remedy (docs/restarts.md, "Remedies"). A script that wants
them applied reads them through these functions, which are cheap (no torch)
and return the neutral value when no remedy is active::

    plan = trainmedic.micro_batch_plan(batch_size=64)
    loader = DataLoader(ds, batch_size=plan.micro_batch_size,
                        num_workers=trainmedic.max_num_workers(8))
    for i, batch in enumerate(loader):
        loss = model(batch) / plan.accumulation_steps
        loss.backward()
        if (i + 1) % plan.accumulation_steps == 0:
            optimizer.step(); optimizer.zero_grad()

A malformed value raises :class:`~trainmedic.errors.UsageError` naming the
variable: a remedy silently ignored would repeat the failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainmedic.errors import UsageError

MICRO_BATCH_DIVISOR_ENV = "TRAINMEDIC_MICRO_BATCH_DIVISOR"
"""Divide the micro-batch by this (1, 2, 4, ...), after a CUDA out-of-memory error."""

GRAD_ACCUM_ENV = "TRAINMEDIC_GRAD_ACCUM"
"""Multiply gradient-accumulation steps by this to keep the effective batch."""

MAX_NUM_WORKERS_ENV = "TRAINMEDIC_MAX_NUM_WORKERS"
"""Use at most this many DataLoader workers, after a worker or host-memory failure."""

SHARING_STRATEGY_ENV = "TRAINMEDIC_SHARING_STRATEGY"
"""torch.multiprocessing sharing strategy to use (``file_system``), after fd exhaustion."""

REMEDY_ENV_VARS: Mapping[str, str] = {
    "micro_batch": MICRO_BATCH_DIVISOR_ENV,
    "grad_accum": GRAD_ACCUM_ENV,
    "max_num_workers": MAX_NUM_WORKERS_ENV,
    "sharing_strategy": SHARING_STRATEGY_ENV,
}
"""Remedy name -> the environment variable that carries it."""

SHARING_STRATEGIES = ("file_descriptor", "file_system")


@dataclass(frozen=True)
class MicroBatchPlan:
    """How to split a batch into micro-batches.

    ``micro_batch_size * accumulation_steps == batch_size`` always holds, so the
    effective batch (and the learning-rate schedule tuned for it) is unchanged.

    Attributes:
        micro_batch_size: samples per forward/backward pass.
        accumulation_steps: micro-batches per optimizer step.
        divisor: the requested divisor (``TRAINMEDIC_MICRO_BATCH_DIVISOR``).
    """

    micro_batch_size: int
    accumulation_steps: int
    divisor: int


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _positive_int(environ: Mapping[str, str] | None, name: str, *, minimum: int) -> int | None:
    raw = _env(environ).get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise UsageError(f"{name}={raw!r} must be >= {minimum}")
    return value


def micro_batch_divisor(environ: Mapping[str, str] | None = None) -> int:
    """The micro-batch divisor in force: 1 when no remedy is active."""
    return _positive_int(environ, MICRO_BATCH_DIVISOR_ENV, minimum=1) or 1


def grad_accum_multiplier(environ: Mapping[str, str] | None = None) -> int:
    """Factor for gradient-accumulation steps: ``TRAINMEDIC_GRAD_ACCUM``, else the divisor."""
    value = _positive_int(environ, GRAD_ACCUM_ENV, minimum=1)
    return micro_batch_divisor(environ) if value is None else value


def micro_batch_plan(batch_size: int, environ: Mapping[str, str] | None = None) -> MicroBatchPlan:
    """Split ``batch_size`` by the divisor in force, keeping the effective batch exact.

    The micro-batch is the largest divisor of ``batch_size`` not above
    ``batch_size / divisor``: 64 by 4 gives 16 × 4; 10 by 4 gives 2 × 5.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    divisor = micro_batch_divisor(environ)
    target = max(1, batch_size // divisor)
    micro = next(m for m in range(target, 0, -1) if batch_size % m == 0)
    return MicroBatchPlan(micro, batch_size // micro, divisor)


def max_num_workers(requested: int, environ: Mapping[str, str] | None = None) -> int:
    """``requested`` DataLoader workers, lowered to ``TRAINMEDIC_MAX_NUM_WORKERS`` if set."""
    cap = _positive_int(environ, MAX_NUM_WORKERS_ENV, minimum=0)
    return requested if cap is None else min(requested, cap)


def sharing_strategy(environ: Mapping[str, str] | None = None) -> str | None:
    """The torch.multiprocessing sharing strategy asked for, or ``None``."""
    raw = _env(environ).get(SHARING_STRATEGY_ENV, "").strip()
    if not raw:
        return None
    if raw not in SHARING_STRATEGIES:
        raise UsageError(
            f"{SHARING_STRATEGY_ENV}={raw!r} is not one of {', '.join(SHARING_STRATEGIES)}"
        )
    return raw


def apply_sharing_strategy(environ: Mapping[str, str] | None = None) -> str | None:
    """Set torch.multiprocessing's sharing strategy when a remedy asks for one.

    Call it before creating DataLoaders; returns the strategy set, or ``None``.
    """
    strategy = sharing_strategy(environ)
    if strategy is not None:
        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy(strategy)  # type: ignore[no-untyped-call]
    return strategy


def remedy(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The raw value of remedy ``name`` (see :data:`REMEDY_ENV_VARS`), ``None`` when inactive."""
    try:
        var = REMEDY_ENV_VARS[name]
    except KeyError:
        raise UsageError(f"unknown remedy {name!r}; known: {', '.join(REMEDY_ENV_VARS)}") from None
    value = _env(environ).get(var, "").strip()
    return value or None


def active_remedies(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every remedy in force, name -> value."""
    return {name: value for name in REMEDY_ENV_VARS if (value := remedy(name, environ)) is not None}
