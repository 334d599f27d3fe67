"""A plain training job for ``benchmarks/attach_cost.py``: it knows nothing of trainmedic.

Trains an MLP on a few fixed in-memory batches with one torch thread and
writes one line per step to ``--out``: the step's end on ``time.monotonic()``
(``CLOCK_MONOTONIC``, the clock every process of the machine shares) and the
training thread's CPU time (``time.thread_time()``), so that the benchmark
reads the job's speed in any window from the job's own clock.

* ``small``: 256-512-512-10, batch 32, SGD with momentum: about 2 ms a step.
* ``large``: 1024-1536-1536-10, batch 64, SGD with momentum: about 25 ms a step.

Prints ``ready`` after ``--warmup`` seconds of training, trains until SIGTERM
(or ``--max-seconds``), then prints ``BENCH {...}`` (steps, mean step) and exits.

    python benchmarks/attach_job.py --model small --out steps.txt
"""

from __future__ import annotations

import argparse
import json
import signal
import time

import torch
from torch import nn

MODELS = {"small": (256, 512, 32), "large": (1024, 1536, 64)}
"""Input width, hidden width, batch."""

stop = False


def on_term(signum: int, frame: object) -> None:
    global stop
    stop = True


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--out", required=True, help="one 'monotonic thread_cpu' line a step")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before 'ready'")
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width, hidden, batch = MODELS[args.model]
    model = nn.Sequential(
        nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [(torch.randn(batch, width), torch.randint(0, 10, (batch,))) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    start = time.monotonic()
    ready_at, end = start + args.warmup, start + args.max_seconds
    ready = False
    steps = 0
    with open(args.out, "w", buffering=1 << 20) as out:
        while not stop:
            x, y = batches[steps % len(batches)]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            steps += 1
            now = time.monotonic()
            out.write(f"{now:.6f} {time.thread_time():.6f}\n")
            if not ready and now >= ready_at:
                ready = True
                print("ready", flush=True)
            if now >= end:
                break
    elapsed = time.monotonic() - start
    print("BENCH " + json.dumps({"steps": steps, "step_mean_s": elapsed / max(1, steps)}))


if __name__ == "__main__":
    main()
