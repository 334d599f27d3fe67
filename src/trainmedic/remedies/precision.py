"""Mixed precision check: is autocast faster for this model, and does the loss agree?

:func:`check_mixed_precision` trains copies of the user's model from the same
weights for a few steps on the same batches — in float32, and under autocast
with each reduced precision the device supports (bf16; fp16 on CUDA, with a
``GradScaler``) — and compares step time, peak memory (CUDA) and the loss at
every step. :meth:`PrecisionReport.recommended` is the fastest precision that
is at least ``min_speedup`` faster and whose loss stays within
``max_loss_rel_diff`` of float32's; :meth:`PrecisionReport.apply` gives what a
training loop needs to use it (:class:`MixedPrecision`).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.errors import UsageError
from trainmedic.remedies.oom import free_memory

DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class PrecisionTrial:
    """Training steps in one precision.

    Attributes:
        dtype: ``float32`` (no autocast), ``bfloat16`` or ``float16``.
        step_s: median step time after the warm-up, seconds.
        peak_bytes: CUDA allocator peak over the steps (``None`` on CPU).
        losses: the loss at each step, warm-up included.
        error: why the precision could not run (``None`` when it ran).
    """

    dtype: str
    step_s: float | None
    peak_bytes: int | None
    losses: tuple[float, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class MixedPrecision:
    """How to train in a reduced precision: ``with mp.autocast(): loss = ...``,
    and ``mp.scaler`` (a ``GradScaler`` for float16, else ``None``) for the backward."""

    device_type: str
    dtype: str
    scaler: Any | None = None

    def autocast(self) -> Any:
        import torch

        return torch.autocast(self.device_type, dtype=getattr(torch, self.dtype))

    @property
    def code(self) -> str:
        lines = [f'with torch.autocast("{self.device_type}", dtype=torch.{self.dtype}):']
        lines.append("    loss = loss_fn(model, batch)")
        if self.dtype == "float16":
            return "\n".join(
                [
                    f'scaler = torch.amp.GradScaler("{self.device_type}")',
                    *lines,
                    "scaler.scale(loss).backward()",
                    "scaler.step(optimizer)",
                    "scaler.update()",
                ]
            )
        return "\n".join([*lines, "loss.backward()", "optimizer.step()"])


@dataclass(frozen=True)
class PrecisionReport:
    """The comparison. ``recommended`` is ``None`` when float32 should stay."""

    device_type: str
    supported: dict[str, bool]
    baseline: PrecisionTrial
    trials: tuple[PrecisionTrial, ...]
    recommended: str | None
    reason: str
    min_speedup: float
    max_loss_rel_diff: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    def speedup(self, dtype: str) -> float | None:
        """float32 step time over ``dtype``'s."""
        trial = next((t for t in self.trials if t.dtype == dtype), None)
        if trial is None or trial.step_s is None or self.baseline.step_s is None:
            return None
        return self.baseline.step_s / trial.step_s if trial.step_s > 0 else None

    def loss_rel_diff(self, dtype: str) -> float | None:
        """Largest relative difference of ``dtype``'s loss from float32's over the steps."""
        trial = next((t for t in self.trials if t.dtype == dtype), None)
        if trial is None or not trial.losses or not self.baseline.losses:
            return None
        return _rel_diff(self.baseline.losses, trial.losses)

    def apply(self) -> MixedPrecision | None:
        """What to train with: ``None`` when float32 is recommended."""
        if self.recommended is None:
            return None
        scaler = None
        if self.recommended == "float16":
            import torch

            scaler = torch.amp.GradScaler(self.device_type)
        return MixedPrecision(self.device_type, self.recommended, scaler)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_type": self.device_type,
            "supported": dict(self.supported),
            "recommended": self.recommended,
            "reason": self.reason,
            "trials": [
                {
                    **t.__dict__,
                    "losses": list(t.losses),
                    "speedup": self.speedup(t.dtype) if t.dtype != "float32" else 1.0,
                    "loss_rel_diff": self.loss_rel_diff(t.dtype) if t.dtype != "float32" else 0.0,
                }
                for t in (self.baseline, *self.trials)
            ],
            "notes": list(self.notes),
        }


def supported_dtypes(device_type: str) -> dict[str, bool]:
    """Which reduced precisions autocast offers on ``device_type`` (``cuda`` or ``cpu``).

    CUDA: bf16 where ``torch.cuda.is_bf16_supported()`` (compute capability 8.0
    and newer), fp16 always. CPU: bf16 (fast with AVX512-BF16 or AMX, slow
    without: measured, not assumed); fp16 is not tried on CPU.
    """
    import torch

    if device_type == "cuda":
        if not torch.cuda.is_available():
            return {"bfloat16": False, "float16": False}
        return {"bfloat16": bool(torch.cuda.is_bf16_supported()), "float16": True}
    return {"bfloat16": True, "float16": False}


def _rel_diff(base: Sequence[float], other: Sequence[float]) -> float:
    worst = 0.0
    for a, b in zip(base, other, strict=False):
        worst = max(worst, abs(b - a) / max(abs(a), 1e-12))
    return worst


def check_mixed_precision(
    model: Any,
    batches: Any,
    loss_fn: Callable[[Any, Any], Any],
    *,
    make_optimizer: Callable[[Any], Any] | None = None,
    steps: int = 6,
    warmup: int = 1,
    device_type: str | None = None,
    min_speedup: float = 1.1,
    max_loss_rel_diff: float = 0.05,
    clock: Callable[[], float] = time.perf_counter,
    free: Callable[[], None] = free_memory,
) -> PrecisionReport:
    """Compare float32 with autocast in bf16/fp16 on copies of ``model``.

    Args:
        model: a ``torch.nn.Module`` on its device; never modified.
        batches: one batch, or a list of batches used in turn.
        loss_fn: ``(model, batch) -> scalar loss``.
        make_optimizer: ``params -> optimizer`` (default: SGD, lr 0.01).
        steps: training steps per precision (warm-up included).
        device_type: ``cuda`` or ``cpu``; default: the model's device.
        min_speedup: recommend only when at least this much faster.
        max_loss_rel_diff: ... and the loss differs from float32's by at most this share.
        free: releases each copy's memory before the next (default: garbage
            collection, then CUDA's cached blocks).
    """
    import torch

    if steps <= warmup:
        raise UsageError(f"steps ({steps}) must exceed warmup ({warmup})")
    if device_type is None:
        param = next(iter(model.parameters()), None)
        device_type = param.device.type if param is not None else "cpu"
    if device_type not in ("cuda", "cpu"):
        raise UsageError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    batch_list = list(batches) if isinstance(batches, (list, tuple)) else [batches]
    make_optimizer = make_optimizer or (lambda params: torch.optim.SGD(params, lr=0.01))
    supported = supported_dtypes(device_type)

    def run(dtype: str) -> PrecisionTrial:
        return _train(
            model,
            batch_list,
            loss_fn,
            make_optimizer,
            dtype,
            device_type,
            steps,
            warmup,
            clock,
            free,
        )

    baseline = run("float32")
    if baseline.error is not None:
        raise UsageError(f"the model's float32 step fails: {baseline.error}")
    trials = tuple(run(d) for d in DTYPES if supported[d])
    notes = []
    if device_type == "cpu":
        notes.append("float16 is not tried on CPU; memory is measured on CUDA only")
    candidates = []
    for t in trials:
        if t.error is not None or t.step_s is None or baseline.step_s is None:
            continue
        speedup = baseline.step_s / t.step_s
        diff = _rel_diff(baseline.losses, t.losses)
        if speedup >= min_speedup and diff <= max_loss_rel_diff:
            candidates.append((speedup, t.dtype, diff))
    if candidates:
        best = max(candidates)
        # bf16 needs no loss scaling: prefer it unless fp16 is clearly faster.
        bf16 = next((c for c in candidates if c[1] == "bfloat16"), None)
        if bf16 is not None and bf16[0] >= 0.95 * best[0]:
            best = bf16
        reason = (
            f"{best[1]} autocast is {best[0]:.2f}x as fast as float32 with the loss within "
            f"{best[2]:.2%}"
        )
        recommended: str | None = best[1]
    else:
        recommended = None
        parts = []
        for t in trials:
            if t.error is not None:
                parts.append(f"{t.dtype} failed ({t.error})")
            elif t.step_s is not None and baseline.step_s is not None:
                parts.append(
                    f"{t.dtype} is {baseline.step_s / t.step_s:.2f}x as fast, loss within "
                    f"{_rel_diff(baseline.losses, t.losses):.2%}"
                )
        reason = "keep float32: " + ("; ".join(parts) if parts else "no reduced precision here")
    return PrecisionReport(
        device_type=device_type,
        supported=supported,
        baseline=baseline,
        trials=trials,
        recommended=recommended,
        reason=reason,
        min_speedup=min_speedup,
        max_loss_rel_diff=max_loss_rel_diff,
        notes=tuple(notes),
    )


def _train(
    model: Any,
    batches: list[Any],
    loss_fn: Callable[[Any, Any], Any],
    make_optimizer: Callable[[Any], Any],
    dtype: str,
    device_type: str,
    steps: int,
    warmup: int,
    clock: Callable[[], float],
    free: Callable[[], None],
) -> PrecisionTrial:
    import torch

    copy_ = copy.deepcopy(model)
    copy_.train()
    optimizer = make_optimizer(copy_.parameters())
    scaler = torch.amp.GradScaler(device_type) if dtype == "float16" else None
    cuda = device_type == "cuda" and torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses: list[float] = []
    times: list[float] = []
    try:
        for i in range(steps):
            batch = batches[i % len(batches)]
            t0 = clock()
            with _autocast(device_type, dtype):
                loss = loss_fn(copy_, batch)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            value = float(loss.detach().float())  # synchronises, so the time is the step's
            if i >= warmup:
                times.append(clock() - t0)
            losses.append(value)
    except Exception as exc:
        return PrecisionTrial(dtype, None, None, tuple(losses), f"{type(exc).__name__}: {exc}")
    finally:
        del copy_, optimizer
        free()
    peak = int(torch.cuda.max_memory_allocated()) if cuda else None
    times.sort()
    return PrecisionTrial(dtype, times[len(times) // 2], peak, tuple(losses))


@contextlib.contextmanager
def _autocast(device_type: str, dtype: str) -> Iterator[None]:
    if dtype == "float32":
        yield
        return
    import torch

    with torch.autocast(device_type, dtype=getattr(torch, dtype)):
        yield
