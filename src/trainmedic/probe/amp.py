"""Optimizer steps that ``GradScaler`` skipped (fp16 mixed precision).

``scaler.step(optimizer)`` does not call ``optimizer.step()`` when it finds
inf/NaN gradients, so the optimizer hooks never fire and that iteration
would merge into the next step. A wrapper around ``GradScaler.step`` sees
whether the optimizer stepped during the call; when it did not, the
iteration still ends a step (so every iteration is one step record), and
the skip is counted.

Counts go to the supervisor as ``grad_scaler`` events: one per skip for the
first :data:`EACH_SKIP_EVENTS` skips, then at each power of two, and a
summary when the process exits (``data``: ``step``, ``skipped``,
``skipped_after_warmup``, ``scaler_steps``, ``scale``, ``final``). A few
skips while the scale calibrates (the first :data:`WARMUP_STEPS` steps) and
one per ``growth_interval`` are normal; many more are a scaling problem
(``diagnose/amp.py``).

Under ``torch.compile`` tracing the wrapper steps aside (its thread test and
clock would break the graph), and skips inside a compiled region go uncounted.

Optimizers that scale themselves (``fused=True``: ``_step_supports_amp_scaling``)
step on every call, skip inside their kernel, and are not counted: telling
would need a host-device synchronisation per step.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from trainmedic.probe.hookutil import compiling_reader
from trainmedic.record.events import EventKind

if TYPE_CHECKING:
    from trainmedic.probe.seams import ProbeSeam
    from trainmedic.probe.steps import StepTracker

EACH_SKIP_EVENTS = 10
"""Skips reported one by one before reporting only at powers of two."""
WARMUP_STEPS = 100
"""Scaler steps during which skips calibrate the scale (GradScaler starts at 2**16)."""

_get_ident = threading.get_ident


class SkipCounter:
    """Skipped and total ``scaler.step`` calls of one process."""

    def __init__(self) -> None:
        self.pid: int | None = None  # the process that stepped (a forked child inherits us)
        self.scaler_steps = 0
        self.skipped = 0
        self.skipped_after_warmup = 0
        self.last_scale: float | None = None

    def data(self, step: int | None, final: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "skipped": self.skipped,
            "skipped_after_warmup": self.skipped_after_warmup,
            "scaler_steps": self.scaler_steps,
            "warmup_steps": WARMUP_STEPS,
            "final": final,
        }
        if step is not None:
            out["step"] = step
        if self.last_scale is not None:
            out["scale"] = self.last_scale
        return out


def _scaler_class(torch: Any) -> Any:
    amp = getattr(torch, "amp", None)
    cls = getattr(amp, "GradScaler", None)
    if cls is None:  # torch < 2.3: only the CUDA one
        cls = getattr(getattr(getattr(torch, "cuda", None), "amp", None), "GradScaler", None)
    return cls


def install(torch: Any, probe: ProbeSeam, tracker: StepTracker) -> bool:
    """Wrap ``GradScaler.step``; ``False`` when this torch has no GradScaler."""
    scaler_cls = _scaler_class(torch)
    if scaler_cls is None:
        return False
    import importlib

    optimizer_mod = importlib.import_module("torch.optim.optimizer")
    original = scaler_cls.step
    part = probe.parts["steps"]
    clock = probe.clock
    state = probe.state
    counter = SkipCounter()
    stepped = [False]
    # The post hook that tells a skipped step is registered by the first
    # GradScaler.step: a job without a scaler pays no hook call per step.
    handles: list[Any] = []
    is_compiling = compiling_reader(torch)
    modules = sys.modules

    # No ``is_compiling()`` test: traced, the store is replayed each time the compiled
    # code runs (no graph break), which is what a wrapper running eagerly around a
    # compiled ``optimizer.step()`` needs to know.
    def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        stepped[0] = True

    def report(step: int | None, final: bool = False) -> None:
        verb = "skipped" if not final else "skipped in all"
        message = (
            f"GradScaler {verb} {counter.skipped} of {counter.scaler_steps} optimizer steps "
            "(inf/NaN gradients)"
        )
        if step is not None and not final:
            message = f"GradScaler skipped optimizer step {step} (inf/NaN gradients); " + message
        probe.emit(probe.event(EventKind.GRAD_SCALER, message, counter.data(step, final)))

    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            ("torch._dynamo" in modules and is_compiling())
            or not part.on
            or _get_ident() != state.training_ident
        ):
            return original(self, optimizer, *args, **kwargs)
        if not handles:
            try:
                handles.append(optimizer_mod.register_optimizer_step_post_hook(post_hook))
            except Exception as exc:
                part.fail(exc)
                return original(self, optimizer, *args, **kwargs)
        stepped[0] = False
        t0 = clock()
        result = original(self, optimizer, *args, **kwargs)
        try:
            if not self.is_enabled():
                return result
            counter.scaler_steps += 1
            counter.pid = os.getpid()
            if stepped[0]:
                return result
            # Skipped: the iteration still ends a step of its own.
            tracker.optimizer_enter(t0)
            tracker.optimizer_exit(clock(), id(optimizer))
            counter.skipped += 1
            if counter.scaler_steps > WARMUP_STEPS:
                counter.skipped_after_warmup += 1
            n = counter.skipped
            if n <= EACH_SKIP_EVENTS or n & (n - 1) == 0:
                # The skip check already synchronised: reading the scale costs nothing more.
                counter.last_scale = float(self.get_scale())
                report(tracker.train_steps)
        except Exception as exc:
            part.fail(exc)
        return result

    def at_exit() -> None:
        if counter.scaler_steps and counter.pid == os.getpid():
            with contextlib.suppress(Exception):
                report(None, final=True)

    step.__wrapped__ = original  # type: ignore[attr-defined]
    step.__doc__ = original.__doc__
    scaler_cls.step = step
    def remove_hook() -> None:
        while handles:
            handles.pop().remove()

    # Registered after the probe's own exit handler, so it runs first (LIFO).
    atexit.register(at_exit)
    probe.restore.append(remove_hook)
    probe.restore.append(lambda: setattr(scaler_cls, "step", original))
    probe.restore.append(lambda: atexit.unregister(at_exit))
    return True
