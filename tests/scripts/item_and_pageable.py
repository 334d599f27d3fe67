"""A training loop that reads its loss with ``.item()`` every step and copies each batch
from pageable host memory (not written for trainmedic).

Arguments: steps, device (``cpu`` or ``cuda``). Prints ``done N`` at the end.
"""

import sys

import torch


def train_step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()  # a host-device synchronisation every step


def main():
    steps, device = int(sys.argv[1]), torch.device(sys.argv[2])
    rows, width = (4096, 1024) if device.type == "cuda" else (64, 128)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Batches in ordinary (pageable) host memory, copied without pin_memory each step.
    batches = [(torch.randn(rows, width), torch.randint(0, 10, (rows,))) for _ in range(4)]
    for i in range(steps):
        x, y = batches[i % len(batches)]
        train_step(model, opt, x.to(device), y.to(device))
    print(f"done {steps}")


if __name__ == "__main__":
    main()
