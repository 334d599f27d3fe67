"""An ordinary training script whose loading costs more than its step: a CPU-heavy
per-sample transform with the DataLoader's default settings (``num_workers=0``).

Usage: python input_bound_train.py [STEPS] [--spawn] [--lambda]
``--spawn`` makes workers start with spawn; ``--lambda`` gives the dataset a lambda
transform, which spawned workers cannot unpickle.
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __init__(self, n: int, transform=None) -> None:
        self.n = n
        self.transform = transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 32, 32, generator=g)
        for _ in range(40):  # the "augmentation": CPU work per sample
            x = torch.tanh(x * 1.01 + 0.01)
        if self.transform is not None:
            x = self.transform(x)
        return x, i % 10


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    steps = int(args[0]) if args else 60
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transform = (lambda x: x) if "--lambda" in sys.argv else None
    kwargs = {"multiprocessing_context": "spawn"} if "--spawn" in sys.argv else {}
    loader = DataLoader(Augmented(100_000, transform), batch_size=32, shuffle=True, **kwargs)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
        if done >= steps:
            break
    print(f"trained {done} steps, workers={loader.num_workers}")


if __name__ == "__main__":
    main()
