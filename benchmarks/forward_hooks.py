"""What each way of seeing outermost module calls costs a training step (docs/performance.md).

The probe needs the outermost module calls on the training thread (the model,
the loss module) and nothing nested. Each way below marks them the same
way (a depth flag set and cleared around the outermost call, as the probe's
wrapper does) on the ``deep-N`` networks of ``bench_models`` (4 N + 2 module
calls per forward, plus the loss), in one process, rounds rotating through the
ways; per step, the training thread's CPU above no instrumentation at all:

* ``Module.__call__`` wrapper: a Python wrapper on ``torch.nn.Module.__call__``
  that returns at once for nested calls (the probe before it learned roots);
* global forward hooks: ``register_module_forward_pre_hook`` and
  ``register_module_forward_hook``, returning at once when nested;
* root instance hooks: forward pre/post hooks on the model and loss instances;
* root instance ``forward``: an instance attribute shadowing the class's forward;
* root class ``__call__`` (the probe now): a wrapper on the ``__call__`` of the
  model's and the loss's classes only.

    python benchmarks/forward_hooks.py [--blocks 4,16,64] [--rounds 9] [--steps 300] [--bytecodes]

``--bytecodes`` counts the Python bytecodes each way adds per step instead
(``sys.settrace`` opcode events): exact, and undisturbed by other users of
the machine, though a bytecode of the global hooks' slow path in torch and
one of a wrapper do not cost quite the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import Job, build, module_calls


class Depth:
    value = 0


def _module_call(depth: Depth) -> Callable[[], None]:
    original = nn.Module.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if depth.value:
            return original(self, *args, **kwargs)
        depth.value = 1
        try:
            return original(self, *args, **kwargs)
        finally:
            depth.value = 0

    nn.Module.__call__ = __call__  # type: ignore[method-assign]
    return lambda: setattr(nn.Module, "__call__", original)


def _global_hooks(depth: Depth) -> Callable[[], None]:
    def pre(module: Any, args: Any) -> None:
        depth.value += 1

    def post(module: Any, args: Any, output: Any) -> None:
        depth.value -= 1

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    return lambda: [h.remove() for h in handles] and None


def _instance_hooks(depth: Depth, roots: list[nn.Module]) -> Callable[[], None]:
    def pre(module: Any, args: Any) -> None:
        depth.value = 1

    def post(module: Any, args: Any, output: Any) -> None:
        depth.value = 0

    handles = []
    for m in roots:
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    return lambda: [h.remove() for h in handles] and None


def _instance_forward(depth: Depth, roots: list[nn.Module]) -> Callable[[], None]:
    for m in roots:
        original = m.forward

        def forward(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            depth.value = 1
            try:
                return _original(*args, **kwargs)
            finally:
                depth.value = 0

        m.forward = forward  # type: ignore[method-assign]
    return lambda: [m.__dict__.pop("forward") for m in roots] and None


def _class_call(depth: Depth, roots: list[nn.Module]) -> Callable[[], None]:
    classes = {type(m) for m in roots}
    for cls in classes:
        original = nn.Module.__call__

        def __call__(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if depth.value:
                return _original(self, *args, **kwargs)
            depth.value = 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                depth.value = 0

        cls.__call__ = __call__  # type: ignore[method-assign]
    return lambda: [delattr(c, "__call__") for c in classes] and None


WAYS: dict[str, Callable[[Depth, list[nn.Module]], Callable[[], None]]] = {
    "none": lambda depth, roots: lambda: None,
    "`Module.__call__` wrapper": lambda depth, roots: _module_call(depth),
    "global forward pre/post hooks": lambda depth, roots: _global_hooks(depth),
    "root instance pre/post hooks": _instance_hooks,
    "root instance `forward` attribute": _instance_forward,
    "root class `__call__` (the probe)": _class_call,
}


def cpu_per_step(job: Job, batch: tuple[Any, Any], steps: int) -> float:
    x, y = batch
    t0 = time.thread_time()
    for _ in range(steps):
        job.step(x, y)
    return (time.thread_time() - t0) / steps


def bytecodes_per_step(job: Job, batch: tuple[Any, Any], steps: int) -> float:
    x, y = batch
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        for _ in range(steps):
            job.step(x, y)
    finally:
        sys.settrace(None)
    return count / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--blocks", default="4,16,64")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--bytecodes", action="store_true", help="count bytecodes, not time")
    args = parser.parse_args()
    measure = bytecodes_per_step if args.bytecodes else cpu_per_step
    rounds = 1 if args.bytecodes else args.rounds
    torch.set_num_threads(1)
    columns = []
    for blocks in (int(b) for b in args.blocks.split(",")):
        job = build(f"deep-{blocks}", batches=4)
        calls = module_calls(job)
        batch = next(iter(job.loader))
        cpu_per_step(job, batch, args.steps // 3)  # warm-up
        roots = [job.model, job.loss_fn]
        per_way: dict[str, list[float]] = {w: [] for w in WAYS}
        for r in range(rounds):
            names = list(WAYS)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                depth = Depth()
                undo = WAYS[name](depth, roots)
                try:
                    per_way[name].append(measure(job, batch, args.steps))
                finally:
                    undo()
        base = statistics.median(per_way["none"])
        extra = {w: statistics.median(v) - base for w, v in per_way.items()}
        columns.append((blocks, calls, base, extra))
        print(f"measured deep-{blocks}", file=sys.stderr)
    if args.bytecodes:
        print(f"bytecodes per step added, over {args.steps} steps\n")
        header = " | ".join(f"deep-{b}: {c} calls, {v:,.0f} bytecodes" for b, c, v, _ in columns)
    else:
        print(f"rounds: {args.rounds}, steps per round: {args.steps}; medians over rounds\n")
        header = " | ".join(f"deep-{b}: {c} calls, {v * 1e3:.2f} ms" for b, c, v, _ in columns)
    print(f"| way | {header} |")
    print("|---|" + "---|" * len(columns))
    for way in WAYS:
        if way == "none":
            continue
        if args.bytecodes:
            cells = " | ".join(
                f"{extra[way]:+,.0f} ({extra[way] / calls:+.1f}/call)"
                for _, calls, _, extra in columns
            )
        else:
            cells = " | ".join(
                f"{extra[way] * 1e6:+.1f} µs ({extra[way] / calls * 1e9:+.0f} ns/call)"
                for _, calls, _, extra in columns
            )
        print(f"| {way} | {cells} |")


if __name__ == "__main__":
    main()
