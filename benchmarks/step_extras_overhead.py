"""What the probe's GradScaler, CUDA-graph and event-device hooks cost an optimizer step.

They are three global optimizer hooks (``trainmedic.probe.graphs.install_step_extras``)
that run on every ``optimizer.step()``. A one-parameter SGD step (about 20 µs
on CPU: nearly all of it torch's own dispatch) is timed with and without them,
alternately in one process, best of several rounds each.

    python benchmarks/step_extras_overhead.py [--rounds 4] [--steps 20000]
"""

from __future__ import annotations

import argparse
import threading
import time
from types import SimpleNamespace

import torch

from trainmedic.probe import graphs
from trainmedic.probe.parts import Parts
from trainmedic.probe.steps import StepTracker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args()
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.zeros(1)

    def per_step() -> float:
        t = time.perf_counter()
        for _ in range(args.steps):
            opt.step()
        return (time.perf_counter() - t) / args.steps

    def best() -> float:
        return min(per_step() for _ in range(5))

    tracker = StepTracker(emit=lambda d: None)
    probe = SimpleNamespace(
        parts=Parts((), (), lambda *a: None),
        clock=time.perf_counter,
        state=SimpleNamespace(training_ident=threading.get_ident()),
        restore=[],
        cuda=SimpleNamespace(captures=0, use_device=lambda d: None),
        emit=lambda m: None,
        event=lambda *a: None,
    )
    best()  # warm up
    bare, hooked = [], []
    for _ in range(args.rounds):
        bare.append(best())
        graphs.install_step_extras(torch, probe, tracker)  # type: ignore[arg-type]
        hooked.append(best())
        while probe.restore:
            probe.restore.pop()()
    b, h = min(bare), min(hooked)
    print(f"optimizer.step(): {b * 1e6:.2f} µs bare, {h * 1e6:.2f} µs with the hooks")
    print(f"the hooks: {(h - b) * 1e6:+.2f} µs per optimizer step")


if __name__ == "__main__":
    main()
