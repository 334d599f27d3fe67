"""A training loop with no torch optimizer: it builds its batches and updates its weights itself.

Not written for trainmedic. Arguments: steps, seconds spent preparing each batch.
"""

import sys
import time

import torch


def make_batch(n, prep_s):
    end = time.perf_counter() + prep_s
    x = torch.randn(n, 16)
    while time.perf_counter() < end:  # decoding and augmenting, say
        x = x * 1.0
    return x, torch.randint(0, 4, (n,))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    prep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    for _ in range(steps):
        x, y = make_batch(12, prep_s)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    print("done", steps)


if __name__ == "__main__":
    main()
