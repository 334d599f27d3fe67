"""What each of the probe's hooks costs inside a real training step, in one process.

``probe_instructions.py`` counts bytecodes, which a busy machine cannot
disturb; but a bytecode run between torch's own code costs several times
what it costs in a tight loop (the caches and branch predictors hold torch,
not the probe). This times each call site of a training step where it runs -
the DataLoader's ``__next__``, ``zero_grad``, the model's call, the loss
module's call, ``backward()`` and ``optimizer.step()`` - in rounds that
alternate the probe's hooks installed and removed (no probe threads: hooks
only, nothing sent), and prints per call site the plain time and the median
of the paired differences.

The hooks follow their schedule as under ``trainmedic run``: on short steps
the compute hooks run in windows (docs/run.md, "Compute hooks on a share of
short steps"); ``--every-step`` keeps them on every step (what a window's
step costs).

``--no-tracker`` replaces the step tracker's event methods with no-ops: what
remains is the wrappers' own cost (entering a Python wrapper, the thread and
``torch.compile`` tests, reading the clock). Since the compute hooks are
sampled it gives no floor: with no step ending, the detail switch never
takes them off, and the tracker is left in states no real run reaches. It
measured +46.7 µs on the MLP, more than the hooks as scheduled (+14.9 µs)
or every hook on every step (+17-23 µs): not to be trusted until reworked.

    python benchmarks/hook_costs.py [--model tiny] [--rounds 30] [--steps 500]
        [--no-tracker] [--every-step]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import Job, build

from trainmedic.probe import steps, torch_hooks
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.forward import DISCOVERY_CALLS
from trainmedic.probe.runtime import Probe

SITES = ("DataLoader __next__", "zero_grad", "model(x)", "loss_fn(out, y)", "backward()",
         "optimizer.step()")  # fmt: skip
TRACKER_EVENTS = (
    "forward_enter", "forward_exit", "loader_enter", "loader_exit",
    "backward_enter", "backward_exit", "optimizer_enter", "optimizer_exit",
)  # fmt: skip


def timed_steps(job: Job, n: int) -> list[float]:
    """Mean seconds per step spent at each of :data:`SITES` over ``n`` steps."""
    clock = time.perf_counter
    acc = [0.0] * len(SITES)
    done = 0
    batches = iter(job.loader)
    while done < n:
        t0 = clock()
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(job.loader)
            continue
        t1 = clock()
        job.optimizer.zero_grad()
        t2 = clock()
        out = job.model(x)
        t3 = clock()
        loss = job.loss_fn(out, y)
        t4 = clock()
        loss.backward()
        t5 = clock()
        job.optimizer.step()
        t6 = clock()
        for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            acc[i] += d
        done += 1
    return [a / n for a in acc]


def no_tracker() -> None:
    """Make the step tracker's events no-ops (the wrappers' floor); outermost forward
    calls are still counted, so that the forward watch's discovery ends."""

    def noop(self: Any, *args: Any) -> None:
        return None

    def count(self: steps.StepTracker, *args: Any) -> None:
        self.forwards += 1

    for name in TRACKER_EVENTS:
        setattr(steps.StepTracker, name, count if name == "forward_enter" else noop)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=500, help="steps per round")
    parser.add_argument("--no-tracker", action="store_true", help="tracker events as no-ops")
    parser.add_argument("--every-step", action="store_true", help="compute hooks on every step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.no_tracker:
        no_tracker()
    job = build(args.model)
    off = {"stacks", "heartbeat"} | ({"sampled_detail"} if args.every_step else set())
    probe = Probe(ProbeConfig("unix:/nonexistent", "bench", None, frozenset(off), frozenset()))
    probe.failed = True  # hooks only: nothing is queued or sent
    timed_steps(job, 300)  # warm-up
    rounds: dict[bool, list[list[float]]] = {False: [], True: []}
    installed = False

    def switch(on: bool) -> None:
        nonlocal installed
        if on and not installed:
            probe._install_torch(torch)
            timed_steps(job, 2 * DISCOVERY_CALLS)  # the forward watch's discovery
        elif not on and installed:
            torch_hooks.uninstall(probe)
        installed = on

    for r in range(args.rounds):
        for on in (False, True) if r % 2 else (True, False):
            switch(on)
            rounds[on].append(timed_steps(job, args.steps))
    switch(False)
    print(
        f"model {args.model}, {args.rounds} rounds of {args.steps} steps, hooks alternately "
        f"on and off{'; tracker events as no-ops' if args.no_tracker else ''}"
        f"{'; compute hooks on every step' if args.every_step else ''}\n"
    )
    print("| call site | plain (µs) | with the hooks, paired difference (median, µs) |")
    print("|---|---|---|")
    total = 0.0
    for i, site in enumerate(SITES):
        plain = [r[i] for r in rounds[False]]
        diffs = [(b[i] - a[i]) * 1e6 for a, b in zip(rounds[False], rounds[True], strict=True)]
        total += statistics.median(diffs)
        plain_us = statistics.median(plain) * 1e6
        print(f"| {site} | {plain_us:.2f} | {statistics.median(diffs):+.2f} |")
    print(f"| all | | {total:+.2f} |")


if __name__ == "__main__":
    main()
