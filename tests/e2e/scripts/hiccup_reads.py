"""Training that stalls now and then: a read hangs whenever the storage hiccups.

An ordinary script, not written for any tool. Samples are ``.npy`` files read
by two DataLoader workers; reads are fast, except that every
``--hang-every``-th read of a worker hangs for ``--hang-s`` seconds
(``Storage`` stands for a network filesystem whose server pauses): the
reader blocks in read(2) until the data arrive.

    python hiccup_reads.py DATA_DIR --steps 1500 --hang-every 19200 --hang-s 1.4
"""

import argparse
import os
import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Storage:
    """Reads files; every ``hang_every``-th read of a process hangs for ``hang_s``
    seconds (the data arrive only then), as when a network filesystem's server
    pauses."""

    def __init__(self, hang_every, hang_s):
        self.hang_every, self.hang_s = hang_every, hang_s
        self.reads = 0

    def read(self, path):
        self.reads += 1
        if self.reads % self.hang_every:
            with open(path, "rb") as f:
                return f.read()
        r, w = os.pipe()

        def deliver():
            with open(path, "rb") as f:
                os.write(w, f.read())
            os.close(w)

        threading.Timer(self.hang_s, deliver).start()
        with os.fdopen(r, "rb") as f:
            return f.read()


class NpyFiles(Dataset):
    def __init__(self, root, storage):
        self.files = sorted(Path(root).glob("*.npy"))
        self.storage = storage

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        raw = self.storage.read(self.files[i])
        return torch.from_numpy(np.frombuffer(raw[-128 * 4 :], dtype=np.float32).copy()), i % 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--hang-every", type=int, default=19200)
    parser.add_argument("--hang-s", type=float, default=1.4)
    args = parser.parse_args()
    if not any(args.data_dir.glob("*.npy")):
        args.data_dir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(4096):
            np.save(args.data_dir / f"{i:05d}.npy", rng.standard_normal(128).astype(np.float32))
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the loader's workers get the other cores
    storage = Storage(args.hang_every, args.hang_s)
    loader = DataLoader(
        NpyFiles(args.data_dir, storage),
        batch_size=64,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
    )
    model = nn.Sequential(
        nn.Linear(128, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 250 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
