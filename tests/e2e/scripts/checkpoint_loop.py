"""A loop that saves a checkpoint after every few steps, synchronously, in the training loop.

An ordinary script, not written for any tool and with no DataLoader: a wide
MLP (about 40 MB of weights and optimizer state) trains on tensors in memory
and ``torch.save``s model and optimizer every ``--every`` steps to CKPT_DIR,
fsyncing the file as careful scripts do.

    python checkpoint_loop.py CKPT_DIR --steps 60 --every 2
"""

import argparse
import os
from pathlib import Path

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir", type=Path)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=2)
    args = parser.parse_args()
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = torch.randn(1024, 512)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(1, args.steps + 1):
        i = (step * 32) % (1024 - 32)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 32]), y[i : i + 32])
        loss.backward()
        optimizer.step()
        if step % args.every == 0:
            path = args.ckpt_dir / "last.pt"
            with open(path, "wb") as f:
                torch.save(
                    {
                        "step": step,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    f,
                )
                f.flush()
                os.fsync(f.fileno())
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
