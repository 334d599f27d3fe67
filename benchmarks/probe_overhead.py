"""Measure what the probe costs a fast training loop (docs/run.md, "Overhead").

A CPU training loop (a small MLP, a DataLoader over tensors in memory, a few
milliseconds per step) runs in this process in rounds, alternately with the
probe's torch hooks installed and removed, while the probe's background
thread reports to a channel server as under ``trainmedic run``. Alternating
in one process keeps the comparison fair on a busy machine, where separate
processes differ by more than the probe costs. Reported per step: the
training thread's CPU time (what the hooks cost the loop) and the CPU of the
probe's own threads, each from the least disturbed round (other users of the
machine only ever add time).

    python benchmarks/probe_overhead.py [--rounds 20] [--steps 150] [--width 512]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainmedic.channel.server import ChannelServer
from trainmedic.probe import torch_hooks
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import Probe


def make_loop(steps: int, width: int):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(steps * 64, 256), torch.randint(0, 10, (steps * 64,)))
    model = torch.nn.Sequential(
        torch.nn.Linear(256, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def loop() -> tuple[float, float, float]:
        """(wall, training-thread CPU, all-threads CPU) per step, seconds."""
        n = 0
        wall0, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
        for x, y in DataLoader(data, batch_size=64):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            n += 1
        wall = (time.perf_counter() - wall0) / n
        thread = (time.thread_time() - thread0) / n
        return wall, thread, (time.process_time() - process0) / n

    return loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--disable", default="", help="probe parts to leave off, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = make_loop(args.steps, args.width)
    loop()  # warm-up
    messages = 0
    lock = threading.Lock()

    def count(_message: object) -> None:
        nonlocal messages
        with lock:
            messages += 1

    plain: list[tuple[float, float, float]] = []
    probed: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = ChannelServer(Path(tmp), "bench", count)
        server.start()
        off = frozenset(p for p in args.disable.split(",") if p)
        config = ProbeConfig(server.address, "bench", None, off, frozenset())
        probe = Probe(config)
        probe.start()  # torch is imported already: this installs the hooks at once
        torch_hooks.uninstall(probe)
        try:
            for _ in range(args.rounds):
                plain.append(loop())
                probe._install_torch(torch)
                probed.append(loop())
                torch_hooks.uninstall(probe)
        finally:
            probe.at_exit()
            server.wait_idle(5)
            server.close()

    def med(runs: list[tuple[float, float, float]], i: int) -> float:
        # The least disturbed round: other users of the machine only ever add time.
        return min(r[i] for r in runs)

    step = med(plain, 0)
    hooks = med(probed, 1) - med(plain, 1)
    threads = (med(probed, 2) - med(probed, 1)) - (med(plain, 2) - med(plain, 1))
    print(f"step (no probe): {step * 1e3:.3f} ms wall, {med(plain, 1) * 1e3:.3f} ms CPU")
    print(f"probe hooks, training thread: {hooks * 1e6:+.1f} µs CPU per step ({hooks / step:+.2%})")
    print(f"probe threads (sending, sampling): {threads * 1e6:+.1f} µs CPU per step")
    print(f"messages received: {messages}")


if __name__ == "__main__":
    main()
