"""A loop whose own Python bookkeeping costs more than the step.

An ordinary script, not written for any tool and with no DataLoader: a small
model trains on tensors in memory; after each step the loop updates an
exponential moving average of the weights *in pure Python*, element by
element, and keeps a per-parameter history in dictionaries.

    python python_overhead.py --steps 80
"""

import argparse

import torch
from torch import nn


def update_averages(averages, model, decay=0.99):
    for name, p in model.named_parameters():
        values = p.detach().flatten().tolist()
        avg = averages.setdefault(name, [0.0] * len(values))
        for k, v in enumerate(values):
            avg[k] = decay * avg[k] + (1 - decay) * v


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 64)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    averages = {}
    for step in range(1, args.steps + 1):
        i = (step * 64) % (4096 - 64)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
        loss.backward()
        optimizer.step()
        update_averages(averages, model)
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
