"""An ordinary training loop whose DataLoader is slower than the model.

Not written for trainmedic. Arguments: steps, per-sample delay (seconds),
num_workers, batch size.
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __init__(self, n, delay):
        self.n = n
        self.delay = delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.delay
        x = torch.zeros(16)
        while time.perf_counter() < end:  # CPU-bound "transform"
            x = x + 1.0
        return torch.randn(16), i % 4


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.004
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: more threads only fight over the cores
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(SlowDataset(steps * batch, delay), batch_size=batch, num_workers=workers)
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    print("done", steps)


if __name__ == "__main__":
    main()
