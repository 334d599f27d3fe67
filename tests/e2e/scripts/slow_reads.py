"""Input-bound training on slow storage: every file read waits for the disk.

An ordinary script, not written for any tool. The data set is one ``.npy``
file per sample; reads go through ``slow_read``, which stands for a mount
whose reads take ``--latency-ms`` (a network filesystem far away): the data
arrive through a pipe after the latency, so the reader blocks in read(2)
exactly as on such a mount. Two DataLoader workers read; a small MLP trains.

    python slow_reads.py DATA_DIR --steps 40 --latency-ms 4
"""

import argparse
import os
import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def slow_read(path, latency_s):
    r, w = os.pipe()

    def deliver():
        with open(path, "rb") as f:
            data = f.read()
        os.write(w, data)
        os.close(w)

    threading.Timer(latency_s, deliver).start()
    with os.fdopen(r, "rb") as f:
        return f.read()


class NpyFiles(Dataset):
    def __init__(self, root, latency_s):
        self.files = sorted(Path(root).glob("*.npy"))
        self.latency_s = latency_s

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        raw = slow_read(self.files[i], self.latency_s)
        x = np.frombuffer(raw[-256 * 4 :], dtype=np.float32).copy()
        return torch.from_numpy(x), i % 10


def write_data(root, n):
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(root / f"{i:05d}.npy", rng.standard_normal(256).astype(np.float32))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not any(args.data_dir.glob("*.npy")):
        write_data(args.data_dir, 32 * args.steps)
    torch.manual_seed(0)
    loader = DataLoader(
        NpyFiles(args.data_dir, args.latency_ms / 1000),
        batch_size=32,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
        if step == args.steps:
            break


if __name__ == "__main__":
    main()
