"""Compute-bound training with more intra-op threads than the machine has cores.

An ordinary script, not written for any tool: it sets ``torch.set_num_threads``
to a fixed 8 (a value copied from a bigger machine) and trains an MLP on
tensors in memory.

    python oversubscribed.py --steps 300 --threads 8
"""

import argparse

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(8192, 512)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 2)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        i = (step * 256) % (8192 - 256)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 256]), y[i : i + 256])
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
