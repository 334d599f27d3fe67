"""Training that stalls at every epoch start: DataLoader workers are started anew.

An ordinary script, not written for any tool. Each worker opens an expensive
resource when it starts (``worker_init_fn`` builds a lookup table, as scripts
do when they open a tokenizer, an LMDB environment or a decoder per worker),
and the DataLoader does not keep its workers between epochs, so the first
batch of every epoch waits for new workers.

    python worker_startup.py --epochs 3 --steps-per-epoch 400 --init-s 1.2
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

INIT_S = 1.5


def open_resources(worker_id):
    # Stands for building a vocabulary / opening a database: CPU work that takes a while.
    deadline = time.perf_counter() + INIT_S
    table = {}
    while time.perf_counter() < deadline:
        table[len(table) % 4096] = len(table)


def main():
    global INIT_S
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=150)
    parser.add_argument("--init-s", type=float, default=1.5)
    args = parser.parse_args()
    INIT_S = args.init_s
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the loader's workers get the other cores
    n = 64 * args.steps_per_epoch
    data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
    loader = DataLoader(
        data, batch_size=64, shuffle=True, num_workers=2, worker_init_fn=open_resources
    )
    model = nn.Sequential(
        nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
