"""Input-bound training on a CPU with no core to spare: the workers' transforms use them all.

An ordinary script, not written for any tool: every sample is synthesised and
filtered with expensive numpy work in ``--workers`` DataLoader workers (one
per core by default), faster than any one core could, yet still slower than
the small model trains.

    python saturating_workers.py --steps 60
"""

import argparse
import os

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Filtered(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        x = rng.standard_normal((96, 96))
        for _ in range(12):
            x = np.real(np.fft.ifft2(np.fft.fft2(x) * 0.9)) + 0.01 * rng.standard_normal((96, 96))
        return torch.from_numpy(x[::6, ::6].astype(np.float32)).flatten(), i % 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(
        Filtered(32 * args.steps), batch_size=32, num_workers=args.workers, persistent_workers=True
    )
    model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
