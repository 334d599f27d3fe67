"""A loop that pulls every output back into Python after each step.

An ordinary script, not written for any tool and with no DataLoader: a small
classifier trains on tensors in memory, and after each step the loop turns the
predictions, the probabilities and the loss into Python values
(``.tolist()``, ``.item()``) to keep its own running statistics, which on a
GPU forces a host-device synchronisation and a copy every step.

    python sync_loop.py --steps 100
"""

import argparse

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=2048)
    args = parser.parse_args()
    torch.manual_seed(0)
    n = 8 * args.batch_size
    x = torch.randn(n, 32)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 100))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen, correct, history = 0, 0, []
    for step in range(1, args.steps + 1):
        i = (step * args.batch_size) % (n - args.batch_size)
        xb, yb = x[i : i + args.batch_size], y[i : i + args.batch_size]
        optimizer.zero_grad()
        out = model(xb)
        loss = nn.functional.cross_entropy(out, yb)
        loss.backward()
        optimizer.step()
        probabilities = out.softmax(1).tolist()
        predictions = out.argmax(1).tolist()
        correct += int((out.argmax(1) == yb).sum().item())
        seen += len(predictions)
        history.append((loss.item(), probabilities[0]))
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.3f} acc {correct / seen:.3f}", flush=True)


if __name__ == "__main__":
    main()
