"""A loop that saves a checkpoint every few steps, synchronously, in the training loop.

An ordinary script, not written for any tool and with no DataLoader: a
bag-of-embeddings classifier (a 20 MB embedding table, sparse gradients, so a
step is cheap) trains on token ids in memory and ``torch.save``s model and
optimizer every ``--every`` steps to CKPT_DIR, fsyncing the file as careful
scripts do.

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
    vocab = 80_000
    tokens = torch.randint(0, vocab, (4096, 32))
    labels = (tokens[:, 0] % 2).long()
    embed = nn.EmbeddingBag(vocab, 64, mode="mean", sparse=True)
    head = nn.Linear(64, 2)
    model = nn.ModuleDict({"embed": embed, "head": head})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, args.steps + 1):
        i = (step * 64) % (4096 - 64)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(head(embed(tokens[i : i + 64])), labels[i : i + 64])
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
