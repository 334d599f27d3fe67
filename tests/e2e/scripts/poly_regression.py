"""Fitting a polynomial with hand-written SGD, in the shape of pytorch/examples' ``regression``.

An ordinary script, not written for any tool: no DataLoader and no optimizer.
Each step draws a fresh batch of random points, builds the features
``[x, x^2, x^3, x^4]``, runs a ``Linear`` layer, and updates the parameters by
hand (``param.data.add_(-lr * param.grad)``) until the loss is under a bound.
Steps take well under a millisecond and the whole run a second or two, so a
diagnosis has few chances to look at what the loop does between steps.

    python poly_regression.py [--max-steps N]
"""

import argparse
from itertools import count

import torch
import torch.nn.functional as F

DEGREE = 4


def make_features(x):
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, DEGREE + 1)], 1)


def target(x, w, b):
    return x.mm(w) + b.item()


def get_batch(w, b, batch_size=32):
    x = make_features(torch.randn(batch_size))
    return x, target(x, w, b)


def describe(w, b):
    terms = " ".join(f"{v:+.2f} x^{i + 1}" for i, v in enumerate(w.tolist()))
    return f"y = {terms} {b.item():+.2f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=200_000)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()
    torch.manual_seed(1)
    w_target = torch.randn(DEGREE, 1) * 5
    b_target = torch.randn(1) * 5
    fc = torch.nn.Linear(DEGREE, 1)
    loss = float("inf")
    for step in count(1):
        batch_x, batch_y = get_batch(w_target, b_target)
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        if loss < args.tolerance or step >= args.max_steps:
            break
    print(f"Loss: {loss:.6f} after {step} batches")
    print("learned:", describe(fc.weight.view(-1), fc.bias))
    print("actual: ", describe(w_target.view(-1), b_target))


if __name__ == "__main__":
    main()
