"""An ordinary PyTorch training script that saves and resumes its own checkpoint.

Nothing in it knows about trainmedic. Each step trains a small linear model
on a batch from a DataLoader; every ``--every`` steps it saves
``<state>/ckpt-<step>.pt`` (temporary file, then rename) and a start resumes
from the newest one by itself, or from ``--resume PATH`` when given. At step
``--at`` of the first attempt (no ``<state>/faulted`` marker) it injects
``--fault``: sleep, lock, busy, segfault, exception, alloc (a 64 GiB tensor),
worker (a DataLoader worker blocks forever in ``__getitem__``), none.

Every pid it and its DataLoader workers have is appended to ``<state>/pids``;
``<state>/resumed`` gets the step it resumed from, ``<state>/done`` the last step.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


def note_pid(state: str, pid: int) -> None:
    with open(os.path.join(state, "pids"), "a") as f:
        f.write(f"{pid}\n")


class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, state: str, hang_index: int | None) -> None:
        self.state = state
        self.hang_index = hang_index

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.hang_index is not None and i == self.hang_index:
            time.sleep(3600)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(dim=0, keepdim=True)


def worker_init(_worker_id: int) -> None:
    note_pid(os.environ["TRAINER_STATE"], os.getpid())


def newest(state: str) -> str | None:
    files = glob.glob(os.path.join(state, "ckpt-*.pt"))
    return max(files, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[-1]), default=None)


def fault(kind: str) -> None:
    print(f"injecting {kind}", flush=True)
    if kind == "sleep":
        time.sleep(3600)
    elif kind == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif kind == "busy":
        x = 0
        while True:
            x += 1
            if x < 0:
                break
    elif kind == "segfault":
        ctypes.string_at(0)
    elif kind == "exception":
        raise RuntimeError("loss is NaN: the learning rate is far too high")
    elif kind == "alloc":
        torch.empty(64 * 2**30, dtype=torch.uint8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--at", type=int, default=30)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--own-resume", action="store_true", help="resume from the newest file")
    args = parser.parse_args()
    os.makedirs(args.state, exist_ok=True)
    os.environ["TRAINER_STATE"] = args.state
    note_pid(args.state, os.getpid())
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    path = args.resume or (newest(args.state) if args.own_resume else None)
    if path:
        ckpt = torch.load(path, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start = int(ckpt["step"])
    with open(os.path.join(args.state, "resumed"), "a") as f:
        f.write(f"{start}\n")
    marker = os.path.join(args.state, "faulted")
    first = not os.path.exists(marker)
    hang_index = None
    if args.fault == "worker" and first:
        open(marker, "w").close()
        hang_index = (args.at - start) * 4  # the batch of step --at, counted from this start
    loader = DataLoader(
        Batches(args.state, hang_index),
        batch_size=4,
        num_workers=args.workers,
        worker_init_fn=worker_init if args.workers else None,
    )
    batches = iter(loader)
    for step in range(start + 1, args.steps + 1):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.every == 0:
            tmp = os.path.join(args.state, f".ckpt-{step}.tmp")
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp
            )
            os.replace(tmp, os.path.join(args.state, f"ckpt-{step}.pt"))
        if step == args.at and args.fault not in ("none", "worker") and first:
            open(marker, "w").close()
            fault(args.fault)
    with open(os.path.join(args.state, "done"), "w") as f:
        f.write(f"{args.steps}\n")
    print("finished", flush=True)


if __name__ == "__main__":
    main()
