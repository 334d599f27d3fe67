"""Full-batch training with LBFGS, whose closure runs forward and backward several times a step.

Not written for trainmedic. Argument: steps. Prints how often the closure ran.
"""

import sys

import torch


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(64, 1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4, history_size=4)
    calls = 0

    def closure():
        nonlocal calls
        calls += 1
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    print("closure calls", calls)


if __name__ == "__main__":
    main()
