"""A training job that knows nothing of trainmedic, for ``trainmedic attach`` to watch.

Arguments: kind (``loader`` | ``compute`` | ``lock`` | ``held``), seconds to train. Prints ``ready``
once it trains, ``done STEPS`` at the end (``lock``: ``stuck`` before the second
acquire).

* ``loader``: a DataLoader with ``num_workers=0`` whose Dataset spends ~4 ms of CPU a
  sample, 8 samples a batch, on a small model: the training thread loads its own batches.
* ``compute``: batches made once, a model whose step is all forward/backward/optimizer.
* ``lock``: trains a few steps, then takes a lock it already holds: stuck for good.
* ``held``: trains a few steps, then waits for a lock a thread of its own took and keeps.
"""

import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        end = time.perf_counter() + 0.004
        x = 0
        while time.perf_counter() < end:
            x += 1
        return torch.randn(32), i % 4


def keep(lock, taken):
    with lock:  # the keeper holds it
        taken.set()
        threading.Event().wait()


def main():
    kind, seconds = sys.argv[1], float(sys.argv[2])
    torch.set_num_threads(1)
    width = 512 if kind == "compute" else 32
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if kind == "loader":
        batches = iter(DataLoader(SlowDataset(), batch_size=8, num_workers=0))
    else:
        fixed = (torch.randn(256, width), torch.randint(0, 4, (256,)))
        batches = iter(lambda: fixed, None)
    lock = threading.Lock()
    steps, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        x, y = next(batches)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if steps == 5:
            print("ready", flush=True)
        if kind == "lock" and steps == 10:
            lock.acquire()
            print("stuck", flush=True)
            lock.acquire()  # never returns
        if kind == "held" and steps == 10:
            taken = threading.Event()
            threading.Thread(target=keep, args=(lock, taken), name="keeper", daemon=True).start()
            taken.wait()
            print("stuck", flush=True)
            with lock:  # never entered
                pass
    print(f"done {steps}", flush=True)


if __name__ == "__main__":
    main()
