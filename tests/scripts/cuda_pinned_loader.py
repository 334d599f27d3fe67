"""A CUDA job fed by one DataLoader worker with pinned memory: the training thread
waits for batches while the pin-memory thread hands them on.

    python cuda_pinned_loader.py STEPS
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.002)  # a slow read
        return torch.randn(256), torch.randn(1)


def main():
    steps = int(sys.argv[1])
    model = torch.nn.Linear(256, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=8, num_workers=1, pin_memory=True)
    for step, (x, y) in enumerate(loader, 1):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= steps:
            break
    print(f"done {step}")


if __name__ == "__main__":
    main()
