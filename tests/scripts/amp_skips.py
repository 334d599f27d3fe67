"""fp16-style loss scaling with GradScaler (not written for trainmedic).

Arguments: iterations, every (an iteration whose number is a multiple of
``every`` has an infinite loss: GradScaler skips its optimizer step), device
(``cpu`` or ``cuda``). With ``cuda`` the forward runs under fp16 autocast.
"""

import sys

import torch


def main():
    iterations, every = int(sys.argv[1]), int(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0, growth_interval=10**6)
    skipped = 0
    for i in range(1, iterations + 1):
        x = torch.randn(32, 64, device=device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
            loss = model(x).float().pow(2).mean()
        if i % every == 0:
            loss = loss * float("inf")
        before = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < before
    print("skipped", skipped)


if __name__ == "__main__":
    main()
