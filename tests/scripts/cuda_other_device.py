"""Training on the last GPU without torch.cuda.set_device (not written for trainmedic).

Arguments: steps. GPU-bound: big matmuls, one loss.item() every 10 steps.
"""

import sys

import torch


def main():
    steps = int(sys.argv[1])
    device = torch.device(f"cuda:{torch.cuda.device_count() - 1}")
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU()).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(512, 4096, device=device)
    for i in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if i % 10 == 0:
            loss.item()
    torch.cuda.synchronize(device)
    print(
        "done", steps, "on", device, "current device", torch.cuda.current_device(),
        "peak", torch.cuda.max_memory_allocated(device),
    )


if __name__ == "__main__":
    main()
