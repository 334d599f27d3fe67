"""Datasets and factories for the tuner's tests (``MODULE:FACTORY`` targets)."""

import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset


class Waiting(Dataset):
    """Each sample waits ``wait_s`` (a network or remote-disk read) and costs no CPU."""

    def __init__(self, n: int = 4096, wait_s: float = 0.003) -> None:
        self.n = n
        self.wait_s = wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.wait_s)
        return torch.full((4,), float(i)), i % 3


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(10_000):
            yield torch.zeros(2), i


def waiting() -> Waiting:
    return Waiting()


def waiting_loader() -> DataLoader:
    return DataLoader(Waiting(), batch_size=16, num_workers=0)


def raises() -> Waiting:
    return helper()


def helper() -> Waiting:
    raise ValueError("no data at /mnt/missing")


def not_a_dataset() -> int:
    return 42


def empty() -> Waiting:
    return Waiting(n=0)


def broken_samples() -> Waiting:
    class Broken(Waiting):
        def __getitem__(self, i: int):
            raise KeyError(f"sample {i} has no label")

    return Broken()


NOT_CALLABLE = 3
