"""Datasets and worker functions the applier's tests hand to DataLoaders (importable by
workers, unlike the test module's locals)."""

import os

import torch
from torch.utils.data import Dataset, IterableDataset


class Numbers(Dataset):
    def __init__(self, n: int = 64, transform=None, shape=(3,)) -> None:
        self.n = n
        self.transform = transform
        self.shape = shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.full(self.shape, float(i))
        return self.transform(x) if self.transform is not None else x


class OtherNumbers(Numbers):
    pass


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8.0).reshape(8, 1))


class VaryingShapes(Dataset):
    def __len__(self) -> int:
        return 128

    def __getitem__(self, i: int):
        return torch.zeros(2 + (i // 4) % 3)


def die_at_start(worker_id: int) -> None:
    os._exit(3)  # a worker killed at start (out of memory, a bad native library)
