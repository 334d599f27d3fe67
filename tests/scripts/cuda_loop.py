"""A tiny CUDA training loop (not written for trainmedic).

Arguments: steps, mode: ``loader`` (a DataLoader, optional autocast with
``amp``), ``prep`` (batches built on the host, spinning PREP_S each) or
``sync`` (GPU-bound: big matmuls and ``loss.item()`` every step).

In ``sync`` mode a step's rows are sized to this GPU: at least 256, and enough
for about SYNC_GPU_S of GPU work, so that the loop stays GPU-bound on a GPU
fast enough to finish 256 rows before the host has launched the next step.
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

PREP_S = 0.02
SYNC_GPU_S = 0.002  # GPU time of a "sync" step; its host side takes well under 1 ms
SYNC_MAX_ROWS = 16384


def sync_rows(device, width):
    """Rows per "sync" step: about SYNC_GPU_S of GPU work on this GPU, at least 256."""
    a = torch.randn(1024, width, device=device)
    w = torch.randn(width, width, device=device)
    a @ w  # warm-up: cuBLAS picks its kernel here
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        a @ w
    end.record()
    end.synchronize()
    per_row_s = start.elapsed_time(end) / 1e3 / (4 * 1024)
    # A step: the first layer's forward and its two backward matmuls, per row.
    rows = int(SYNC_GPU_S / (3 * per_row_s)) if per_row_s > 0 else SYNC_MAX_ROWS
    return max(256, min(rows, SYNC_MAX_ROWS))


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
    rows = sync_rows(device, width) if mode == "sync" else 32

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
            x = torch.randn(rows, width, device=device)
            y = torch.randint(0, 10, (x.shape[0],), device=device)
            loss = train(x, y)
            if mode == "sync":
                loss.item()
    torch.cuda.synchronize()
    print("done", steps)


if __name__ == "__main__":
    main()
