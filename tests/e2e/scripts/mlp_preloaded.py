"""Healthy, compute-bound training: an MLP on tensors already in memory.

An ordinary script, not written for any tool: batches are slices of
preloaded tensors, so every step is forward, backward and optimizer.

    python mlp_preloaded.py --steps 300
"""

import argparse

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    n = 16384
    x = torch.randn(n, 128)
    teacher = nn.Sequential(nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 8))
    with torch.no_grad():
        y = teacher(x).argmax(1)
    model = nn.Sequential(
        nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        i = (step * args.batch_size) % (n - args.batch_size)
        xb, yb = x[i : i + args.batch_size], y[i : i + args.batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
