"""Measure what the probe costs a training loop, in one process (docs/performance.md).

Each model of ``bench_models`` trains in this process in rounds, alternately
with the probe's torch hooks installed and removed, while the probe's
background threads report to a channel server in another process, as under
``trainmedic run``. Alternating in one process keeps the comparison fair on a
busy machine, where separate processes differ by more than the probe costs.

Per step, for each model:

* **training thread CPU** (``time.thread_time``): what the hooks cost the
  loop itself, as the median over rounds of (probed - plain) of adjacent
  rounds, with the spread (lowest, highest) of those differences;
* **probe threads CPU**: the CPU clocks of the probe's own threads (sending,
  heartbeats, stack sampling), read per thread; per step and as a share of
  one core over the probed rounds' wall time;
* **wall**: the ratio of probed to plain step time (median of adjacent pairs):
  noisy on a shared machine, the CPU figures are the robust ones.

    python benchmarks/probe_overhead.py [--models mlp,deep,transformer] [--rounds 9]
        [--seconds 1.5] [--disable PART,...]

``--models deep-4,deep-16,deep-64`` (or ``seq-N``) shows how the cost
grows - or does not - with the number of module calls per step.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import Job, build, module_calls

from trainmedic.probe import torch_hooks
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import Probe


def _serve(conn: Any) -> None:
    """A channel server in its own process: reports its address, then the message count."""
    import tempfile

    from trainmedic.channel.server import ChannelServer

    count = 0
    lock = threading.Lock()

    def add(_message: object) -> None:
        nonlocal count
        with lock:
            count += 1

    with tempfile.TemporaryDirectory() as tmp:
        server = ChannelServer(Path(tmp), "bench", add)
        server.start()
        conn.send(server.address)
        conn.recv()  # told to stop
        server.wait_idle(5)
        server.close()
        conn.send(count)


def probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("trainmedic-")]


def thread_cpu(threads: list[threading.Thread]) -> float:
    total = 0.0
    for t in threads:
        try:
            if t.ident is not None:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, ProcessLookupError):
            pass  # the thread ended: its time is lost, a small undercount
    return total


@dataclass
class Round:
    steps: int
    wall_s: float
    thread_s: float
    probe_s: float


def run_round(job: Job, steps: int) -> Round:
    threads = probe_threads()
    probe0 = thread_cpu(threads)
    n = 0
    wall0, thread0 = time.perf_counter(), time.thread_time()
    while n < steps:
        for x, y in job.loader:
            job.step(x, y)
            n += 1
            if n == steps:
                break
    wall = time.perf_counter() - wall0
    thread = time.thread_time() - thread0
    # Threads started during the round (the stack sampler) count from zero.
    probe = thread_cpu(probe_threads()) - probe0
    return Round(n, wall, thread, probe)


def measure(name: str, probe: Probe, rounds: int, seconds: float) -> dict[str, Any]:
    job = build(name)
    calls = module_calls(job)
    first = run_round(job, 20)  # warm-up and a first timing
    steps = max(50, int(seconds / (first.wall_s / first.steps)))
    run_round(job, steps)
    pairs: list[tuple[Round, Round]] = []
    for _ in range(rounds):
        plain = run_round(job, steps)
        probe._install_torch(torch)
        probed = run_round(job, steps)
        torch_hooks.uninstall(probe)
        pairs.append((plain, probed))
    per = [((b.thread_s - a.thread_s) / steps, b.wall_s / a.wall_s) for a, b in pairs]
    hooks = [h for h, _ in per]
    plain_step = statistics.median(a.wall_s / steps for a, _ in pairs)
    plain_cpu = statistics.median(a.thread_s / steps for a, _ in pairs)
    probe_cpu = sum(b.probe_s for _, b in pairs)
    probed_wall = sum(b.wall_s for _, b in pairs)
    return {
        "model": name,
        "module_calls": calls,
        "steps": steps,
        "step_ms": plain_step * 1e3,
        "hooks_us": statistics.median(hooks) * 1e6,
        "hooks_lo_us": min(hooks) * 1e6,
        "hooks_hi_us": max(hooks) * 1e6,
        "hooks_share": statistics.median(hooks) / plain_cpu,
        "threads_us": probe_cpu / (steps * rounds) * 1e6,
        "threads_core": probe_cpu / probed_wall,
        "wall_ratio": statistics.median(r for _, r in per),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="mlp,deep,transformer")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=1.5, help="per round")
    parser.add_argument("--disable", default="", help="probe parts to leave off, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(there,), daemon=True)
    server.start()
    address = here.recv()
    off = frozenset(p for p in args.disable.split(",") if p)
    probe = Probe(ProbeConfig(address, "bench", None, off, frozenset()))
    probe.start()  # torch is imported already: this installs the hooks at once
    torch_hooks.uninstall(probe)
    rows = []
    try:
        for name in args.models.split(","):
            rows.append(measure(name, probe, args.rounds, args.seconds))
            print(f"measured {name}", file=sys.stderr)
    finally:
        probe.at_exit()
        here.send("stop")
        messages = here.recv()
        server.join(10)
    print(
        f"rounds: {args.rounds} pairs of ~{args.seconds:g} s; parts off: {args.disable or 'none'}; "
        f"messages received: {messages}\n"
    )
    print(
        "| model | module calls / step | step (ms) | training thread CPU / step "
        "(median, lowest..highest) | share of step CPU | probe threads CPU / step "
        "| probe threads, % of one core | wall ratio (median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['module_calls']} | {r['step_ms']:.3f} "
            f"| {r['hooks_us']:+.1f} µs ({r['hooks_lo_us']:+.1f}..{r['hooks_hi_us']:+.1f}) "
            f"| {r['hooks_share']:+.2%} | {r['threads_us']:.1f} µs "
            f"| {r['threads_core']:.2%} | {r['wall_ratio']:.3f} |"
        )


if __name__ == "__main__":
    main()
