"""Input-bound training on storage that does not cache: every sample is a real disk read.

An ordinary script, not written for any tool. The data set is one 256 KiB
file per sample; each read bypasses the page cache (``O_DIRECT`` where the
filesystem allows it, else ``posix_fadvise(DONTNEED)`` first), as a data set
far larger than memory, read once per epoch, does. A small MLP trains on a
slice of each file.

    python uncached_reads.py DATA_DIR --steps 60 --workers 0
"""

import argparse
import mmap
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SAMPLE_BYTES = 256 * 1024


def read_uncached(path):
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # a filesystem without O_DIRECT (tmpfs)
        fd = os.open(path, os.O_RDONLY)
        flags = os.O_RDONLY
    try:
        if not flags & getattr(os, "O_DIRECT", 0):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = mmap.mmap(-1, SAMPLE_BYTES)  # page-aligned, as O_DIRECT wants
        try:
            n = os.readv(fd, [buf])
        except OSError:  # O_DIRECT refused at read time: read through the cache, dropped first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n = os.readv(fd, [buf])
        return bytes(buf[:n])
    finally:
        os.close(fd)


class RawFiles(Dataset):
    def __init__(self, root):
        self.files = sorted(Path(root).glob("*.bin"))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        raw = read_uncached(self.files[i])
        x = np.frombuffer(raw[:1024], dtype=np.float32).copy()
        return torch.from_numpy(np.nan_to_num(x, posinf=0.0, neginf=0.0).clip(-10, 10)), i % 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--files", type=int, default=256)
    args = parser.parse_args()
    if not any(args.data_dir.glob("*.bin")):
        args.data_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(args.files):
            (args.data_dir / f"{i:05d}.bin").write_bytes(
                rng.standard_normal(SAMPLE_BYTES // 4).astype(np.float32).tobytes()
            )
        os.sync()
    torch.manual_seed(0)
    loader = DataLoader(
        RawFiles(args.data_dir),
        batch_size=32,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 20 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
