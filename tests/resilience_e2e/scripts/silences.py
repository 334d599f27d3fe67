"""A PyTorch training script with one long silence after its first steps: a pause
that must never count as a hang, or a hang that must always be caught.

Nothing in it knows about trainmedic: steps are found through the optimizer.
It trains ``--before`` steps of about 50 ms, then runs ``--scenario``, then
``--after`` more steps and exits 0. Hangs happen on the first attempt only
(``<state>/faulted`` marks it); a restarted attempt trains straight through.

Pauses: ``eval`` (an unmarked 10 s evaluation), ``save`` (a 1.6 GB
``torch.save`` and ``fsync`` into ``--dir``), ``eigh`` (one ~10 s
``torch.linalg.eigh`` using every core), ``remote`` (DataLoader workers
fetching samples from ``--url`` that answers slowly), ``barrier`` (2 gloo
ranks: rank 0 evaluates 10 s while rank 1 waits in a barrier).
Hangs: ``sleep``, ``lock``, ``busy``, ``gloo`` (rank 1 sleeps forever while
rank 0 waits in an all-reduce), ``reader`` (a DataLoader worker blocks
forever reading a sample from ``--url``, which never answers).

``<state>/events`` gets one JSON line per event: ``{"event", "t", "pid"}``
with ``start`` (each process start), ``pause_start``/``pause_end``,
``hang_start`` and ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request

import torch
from torch.utils.data import DataLoader, Dataset

STEP_S = 0.05


def note(state: str, event: str, **extra: object) -> None:
    with open(os.path.join(state, "events"), "a") as f:
        f.write(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **extra}) + "\n")


class Trainer:
    def __init__(self, width: int = 64) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.width = width

    def step(self, x: torch.Tensor | None = None) -> None:
        t0 = time.perf_counter()
        x = torch.randn(32, self.width) if x is None else x
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        time.sleep(max(0.0, STEP_S - (time.perf_counter() - t0)))

    def evaluate(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        with torch.no_grad():
            while time.monotonic() < end:
                self.model(torch.randn(256, self.width))
                time.sleep(0.01)


class Remote(Dataset[torch.Tensor]):
    """Samples fetched over HTTP, one request each."""

    def __init__(self, url: str, size: int = 1000) -> None:
        self.url = url
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        with urllib.request.urlopen(f"{self.url}/{i}", timeout=3600) as answer:
            body = answer.read()
        raw = bytearray(body[:64].ljust(64, b"\0"))
        return torch.frombuffer(raw, dtype=torch.uint8).float()


class Stalling(Remote):
    """Reads sample ``at`` from a server that never answers."""

    def __init__(self, url: str, state: str, at: int) -> None:
        super().__init__(url)
        self.state = state
        self.at = at

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            note(self.state, "worker_read", index=i)
            return super().__getitem__(i)
        return torch.randn(64)


def _eigh_s(n: int) -> float:
    a = torch.randn(n, n, dtype=torch.float64)
    a = a @ a.T
    t0 = time.perf_counter()
    torch.linalg.eigh(a)
    return max(1e-3, time.perf_counter() - t0)


def eigh_size(target_s: float) -> int:
    """The matrix size whose eigendecomposition takes about ``target_s`` here.

    Timed at 1200, then again nearer the size found: a large matrix uses the cores
    better than a small one, so one small timing overestimates the large call's time
    (3239, sized from 1200 for 10 s, took 4.8 s on two cores)."""
    n = 1200
    n = int(n * (target_s / _eigh_s(n)) ** (1 / 3))
    near = min(max(n, 1200), 2400)
    n = int(near * (target_s / _eigh_s(near)) ** (1 / 3))
    # At least 2200: a calibration slowed by other load must not shrink the call
    # below the floor (2000 took 11 s on two shared cores).
    return int(min(6000, max(2200, n)))


def single(args: argparse.Namespace, first: bool) -> None:
    trainer = Trainer()
    for _ in range(args.before):
        trainer.step()
    scenario = args.scenario
    if scenario == "eval":
        note(args.state, "pause_start")
        trainer.evaluate(args.pause_s)
        note(args.state, "pause_end")
    elif scenario == "save":
        big = torch.ones(400_000_000)  # 1.6 GB of float32
        path = os.path.join(args.dir, "big.pt")
        note(args.state, "pause_start")
        # Saved again (a model, then its optimizer state) until the pause outlasts
        # --pause-s: a fast disk must not make the silence shorter than the floor.
        t0, saves = time.perf_counter(), 0
        while saves == 0 or time.perf_counter() - t0 < args.pause_s:
            with open(path, "wb") as f:
                torch.save({"weights": big}, f)
                f.flush()
                os.fsync(f.fileno())
            saves += 1
        note(args.state, "pause_end", bytes=os.path.getsize(path), saves=saves)
        del big
        os.unlink(path)
    elif scenario == "eigh":
        n = eigh_size(args.pause_s)
        a = torch.randn(n, n, dtype=torch.float64)
        a = a @ a.T
        note(args.state, "pause_start", n=n, threads=torch.get_num_threads())
        torch.linalg.eigh(a)
        note(args.state, "pause_end")
    elif scenario in ("remote", "reader"):
        if scenario == "remote":
            dataset: Dataset[torch.Tensor] = Remote(args.url)
        else:
            dataset = Stalling(args.url, args.state, at=100 if first else -1)
        loader = DataLoader(dataset, batch_size=16, num_workers=2)
        batches = iter(loader)
        note(args.state, "pause_start")
        for _ in range(args.remote_batches if scenario == "remote" else 20):
            trainer.step(next(batches))
        note(args.state, "pause_end")
        del batches
    elif first:
        note(args.state, "hang_start")
        if scenario == "sleep":
            while True:
                time.sleep(1)
        elif scenario == "lock":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
        elif scenario == "busy":
            x = 0
            while True:
                x += 1
                if x < 0:
                    break
    for _ in range(args.after):
        trainer.step()


def rank_main(rank: int, args: argparse.Namespace, first: bool, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    note(args.state, "start", rank=rank)
    trainer = Trainer()
    for _ in range(args.before):
        trainer.step()
        dist.barrier()
    if args.scenario == "barrier":
        if rank == 0:
            note(args.state, "pause_start")
            trainer.evaluate(args.pause_s)
            note(args.state, "pause_end")
        dist.barrier()
    elif first:
        if rank == 1:
            note(args.state, "hang_start")
            while True:
                time.sleep(1)
        dist.all_reduce(torch.ones(4))
    for _ in range(args.after):
        trainer.step()
        dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--before", type=int, default=40)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--pause-s", type=float, default=10.0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--url", default=None)
    parser.add_argument("--remote-batches", type=int, default=2)
    args = parser.parse_args()
    os.makedirs(args.state, exist_ok=True)
    marker = os.path.join(args.state, "faulted")
    first = not os.path.exists(marker)
    open(marker, "a").close()
    note(args.state, "start")
    if args.scenario in ("barrier", "gloo"):
        import torch.multiprocessing as mp

        mp.spawn(rank_main, args=(args, first, free_port()), nprocs=2, join=True)
    else:
        single(args, first)
    note(args.state, "done")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
