"""Input-bound training on remote data: workers fetch every sample over HTTP.

An ordinary script, not written for any tool: the data set is a list of
URLs (``BASE_URL/sample/<i>``), each fetched with urllib by two DataLoader
workers, as from an object store or a data server far away. A small MLP
trains on the samples.

    python http_loader.py http://127.0.0.1:8000 --steps 40
"""

import argparse
import urllib.request

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RemoteSamples(Dataset):
    def __init__(self, base_url, n):
        self.base_url = base_url.rstrip("/")
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with urllib.request.urlopen(f"{self.base_url}/sample/{i}", timeout=30) as response:
            raw = response.read()
        x = np.frombuffer(raw[:1024], dtype=np.float32).copy()
        return torch.from_numpy(x), i % 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(
        RemoteSamples(args.base_url, args.batch_size * args.steps),
        batch_size=args.batch_size,
        num_workers=args.workers,
    )
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
