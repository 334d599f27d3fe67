"""Input-bound training: a CPU-heavy per-sample transform and num_workers=0.

An ordinary script, not written for any tool: 64x64 images get a random crop,
a blur computed with an FFT and noise, one sample at a time in the training
process (the DataLoader has no workers), then a small CNN trains on them.

    python augment_no_workers.py --steps 60 [--workers N]
"""

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class BlurredShapes(Dataset):
    def __init__(self, n, seed=0):
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 4, n)
        yy, xx = np.mgrid[0:72, 0:72]
        self.images = np.stack(
            [
                ((np.abs(xx - 36) < 6 + 6 * c) & (np.abs(yy - 36) < 24 - 4 * c)).astype(np.float32)
                for c in self.labels
            ]
        )

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        ox, oy = rng.integers(0, 8, 2)
        img = self.images[i, oy : oy + 64, ox : ox + 64]
        for _ in range(6):  # several blur passes: an expensive augmentation pipeline
            sigma = rng.uniform(0.5, 2.0)
            f = np.fft.fftfreq(64)
            kernel = np.exp(-2 * (np.pi * sigma) ** 2 * (f[:, None] ** 2 + f[None, :] ** 2))
            img = np.real(np.fft.ifft2(np.fft.fft2(img) * kernel))
        img = img + rng.normal(0, 0.05, img.shape)
        return torch.from_numpy(img.astype(np.float32))[None], int(self.labels[i])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(BlurredShapes(32 * args.steps), batch_size=32, shuffle=True,
                        num_workers=args.workers)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(4),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(4),
        nn.Flatten(),
        nn.Linear(16 * 16, 4),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
