"""The benchmark's training job: a small MLP on preloaded data, a few ms per step.

An ordinary script (it knows nothing about trainmedic). It times its own
training loop and prints one line ``BENCH {json}`` at the end: steps, loop
seconds, per-step percentiles, and the CPU per step of the training thread
and of the whole process (all its threads), so the driver compares loops,
not Python start-up. ``--profiler`` records the whole loop with ``torch.profiler.profile()``
(default activities: CPU, plus CUDA when available; no schedule, so every op
of every step is recorded), the way a person would profile a script.

    python benchmarks/overhead_job.py --steps 2000 [--profiler]
"""

import argparse
import contextlib
import json
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--profiler", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = 64 * 256
    data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=64, shuffle=True, drop_last=True)
    model = nn.Sequential(
        nn.Linear(256, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    profiler = torch.profiler.profile() if args.profiler else contextlib.nullcontext()
    step_times = []
    step = 0
    with profiler:
        thread0, process0 = time.thread_time(), time.process_time()
        start = last = time.perf_counter()
        while step < args.steps:
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                now = time.perf_counter()
                step_times.append(now - last)
                last = now
                step += 1
                if step == args.steps:
                    break
        loop_s = time.perf_counter() - start
        thread_s = time.thread_time() - thread0
        process_s = time.process_time() - process0
    step_times.sort()
    print(
        "BENCH "
        + json.dumps(
            {
                "steps": step,
                "loop_s": loop_s,
                "step_mean_s": loop_s / step,
                "step_median_s": statistics.median(step_times),
                "step_p90_s": step_times[int(0.9 * len(step_times))],
                "thread_cpu_per_step_s": thread_s / step,
                "process_cpu_per_step_s": process_s / step,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
