"""Batches are split along dim 0 wherever their tensors have the batch's size."""

from __future__ import annotations

from collections import namedtuple

import torch

from trainmedic.remedies.batches import batch_size, split

Pair = namedtuple("Pair", "x y")


def test_size_is_the_first_tensors_first_dimension() -> None:
    assert batch_size(torch.zeros(7, 3)) == 7
    assert batch_size(("text", {"a": [torch.zeros(5)]})) == 5
    assert batch_size(["no tensors", 3]) is None
    assert batch_size(torch.tensor(1.0)) is None


def test_split_cuts_tensors_of_the_batch_size_and_keeps_the_rest_whole() -> None:
    table = torch.arange(4)  # another length: passed whole to every part
    batch = {"x": torch.arange(10).reshape(10, 1), "y": Pair(torch.arange(10), table), "n": 3}
    parts = split(batch, 4)
    assert [rows for _, rows in parts] == [4, 4, 2]
    assert torch.equal(torch.cat([p["x"] for p, _ in parts]), batch["x"])
    assert all(isinstance(p["y"], Pair) and p["y"].y is table and p["n"] == 3 for p, _ in parts)
    assert torch.equal(torch.cat([p["y"].x for p, _ in parts]), torch.arange(10))


def test_a_micro_batch_as_large_as_the_batch_is_the_batch_itself() -> None:
    x = torch.zeros(3)
    assert split(x, 8) == [(x, 3)]
