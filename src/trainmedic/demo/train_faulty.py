"""The demo's faulty training job: an ordinary PyTorch loop that fails once.

A small convolutional network learns synthetic 28x28 "digits" (a class is a
blurred stroke pattern) on the CPU. It checkpoints with
``trainmedic.Checkpointer`` every ``--checkpoint-every`` steps and resumes
from the newest checkpoint by itself; it splits each batch with
``trainmedic.micro_batch_plan()``, so a restart after an out-of-memory error
can lower the micro-batch and accumulate gradients to keep the batch.

``--fault`` says what goes wrong, once, on a fresh start (never after a resume):

* ``hang`` — at step ``--at`` the loop blocks forever waiting on a peer that
  never answers (a lock nobody releases), as a lost collective would;
* ``crash`` — at step ``--at`` the process dies of a segmentation fault in
  native code;
* ``oom`` — the job models a GPU with room for ``--memory-samples`` samples
  per micro-batch; a larger micro-batch raises the out-of-memory error torch
  raises on a GPU (``torch.OutOfMemoryError: CUDA out of memory. Tried to
  allocate ...``). This machine may have no GPU, so that limit is modelled;
  the error, its classification and the remedy are the real ones.

Usage: ``python train_faulty.py --fault hang [--steps 60] [--at 30]``
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import time

import torch
from torch import nn

from trainmedic.checkpoint import Checkpointer  # trainmedic.Checkpointer
from trainmedic.remedy_api import micro_batch_plan  # trainmedic.micro_batch_plan


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 5), nn.ReLU()
        )
        self.head = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(torch.flatten(self.features(x), 1))
        return logits


PATTERNS = torch.zeros(10, 1, 28, 28)
for _label in range(10):
    PATTERNS[_label, 0, 2 + 2 * _label : 6 + 2 * _label, 4:24] = 1.0


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    labels = torch.randint(0, 10, (size,), generator=g)
    images = PATTERNS[labels] + torch.randn(size, 1, 28, 28, generator=g) * 0.3
    return images, labels


def out_of_memory(micro: int, limit: int) -> None:
    need = micro * 192 * 2**20
    raise torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {need / 2**30:.2f} GiB. GPU 0 has a total "
        f"capacity of 15.77 GiB of which {limit * 192 / 1024:.2f} GiB is free. Of the "
        "allocated memory 13.90 GiB is allocated by PyTorch, and 0.31 GiB is reserved by "
        "PyTorch but unallocated."
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=("hang", "crash", "oom", "none"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--at", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--memory-samples", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=10)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = SmallNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    ckpt = Checkpointer(every_steps=args.checkpoint_every, keep=2)
    start = ckpt.load(model=model, optimizer=optimizer) or 0
    plan = micro_batch_plan(args.batch_size)
    print(
        f"training steps {start + 1}..{args.steps}"
        + (f" (resumed from step {start})" if start else "")
        + f", micro-batch {plan.micro_batch_size} x {plan.accumulation_steps}",
        flush=True,
    )
    for step in range(start + 1, args.steps + 1):
        images, labels = batch(step, args.batch_size)
        optimizer.zero_grad()
        for chunk in range(plan.accumulation_steps):
            if args.fault == "oom" and plan.micro_batch_size > args.memory_samples:
                out_of_memory(plan.micro_batch_size, args.memory_samples)
            part = slice(chunk * plan.micro_batch_size, (chunk + 1) * plan.micro_batch_size)
            loss = criterion(model(images[part]), labels[part]) / plan.accumulation_steps
            loss.backward()
        optimizer.step()
        ckpt.maybe_save(step, model=model, optimizer=optimizer)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item() * plan.accumulation_steps:.3f}", flush=True)
        if step == args.at and start == 0:
            if args.fault == "hang":
                print(f"step {step}: waiting for a peer that never answers...", flush=True)
                peer = threading.Lock()
                peer.acquire()
                peer.acquire()
            elif args.fault == "crash":
                print(f"step {step}: calling into a native library with a bad pointer", flush=True)
                time.sleep(0.1)
                ctypes.string_at(0)
    print("training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
