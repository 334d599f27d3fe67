"""A loop that sleeps between steps: rate limiting, or waiting for "new data" that is there.

An ordinary script, not written for any tool and with no DataLoader: a small
MLP trains on tensors already in memory, and the loop sleeps ``--sleep-ms``
after every step (as scripts do to throttle themselves or poll a queue).

    python sleep_loop.py --steps 100 --sleep-ms 30
"""

import argparse
import time

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sleep-ms", type=float, default=30.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 64)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, args.steps + 1):
        i = (step * 64) % (4096 - 64)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
        loss.backward()
        optimizer.step()
        time.sleep(args.sleep_ms / 1000)
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
