"""A tiny CUDA training loop (not written for trainmedic).

Arguments: steps, mode: ``loader`` (a DataLoader, optional autocast with
``amp``), ``prep`` (batches built on the host, spinning PREP_S each) or
``sync`` (GPU-bound: big matmuls and ``loss.item()`` every step).
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

PREP_S = 0.02


def main():
    steps = int(sys.argv[1])
    mode = sys.argv[2]
    amp = "amp" in sys.argv[3:]
    device = torch.device("cuda")
    width = 4096 if mode == "sync" else 256
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train(x, y):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    if mode == "loader":
        data = TensorDataset(torch.randn(steps * 32, width), torch.randint(0, 10, (steps * 32,)))
        for x, y in DataLoader(data, batch_size=32, pin_memory=True):
            train(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
    else:
        for _ in range(steps):
            if mode == "prep":
                end = time.perf_counter() + PREP_S
                while time.perf_counter() < end:
                    pass
            x = torch.randn(256 if mode == "sync" else 32, width, device=device)
            y = torch.randint(0, 10, (x.shape[0],), device=device)
            loss = train(x, y)
            if mode == "sync":
                loss.item()
    torch.cuda.synchronize()
    print("done", steps)


if __name__ == "__main__":
    main()
