"""Training over files where one is corrupt and one fails twice before it reads (a flaky
network filesystem), wrapped in ResilientDataset, with two DataLoader workers.

Usage: python resilient_train.py DATA_DIR
"""

import errno
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainmedic.remedies import ResilientDataset


class Files(Dataset):
    def __init__(self, root: Path) -> None:
        self.samples = sorted(str(p) for p in root.glob("*.bin"))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path = self.samples[i]
        if path.endswith("007.bin"):  # the flaky one: EIO until its third read
            marker = path + ".reads"
            reads = int(Path(marker).read_text()) if os.path.exists(marker) else 0
            Path(marker).write_text(str(reads + 1))
            if reads < 2:
                raise OSError(errno.EIO, "Input/output error", path)
        data = Path(path).read_bytes()
        if len(data) != 16:
            raise ValueError(f"truncated file {path}: {len(data)} bytes")
        return torch.frombuffer(bytearray(data), dtype=torch.float32), i % 2


def main() -> None:
    root = Path(sys.argv[1])
    root.mkdir(exist_ok=True)
    for i in range(32):
        data = torch.full((4,), float(i)).numpy().tobytes()
        (root / f"{i:03d}.bin").write_bytes(data[:5] if i == 12 else data)  # 012: corrupt
    dataset = ResilientDataset(Files(root), backoff_s=0.01)
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for _ in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    print(f"trained {steps} steps")


if __name__ == "__main__":
    main()
