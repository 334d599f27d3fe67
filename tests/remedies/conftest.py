"""Tests of the remedies run DataLoader workers inside the test process."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _forget_storages_received_from_workers() -> Iterator[None]:
    """Each tensor received from a DataLoader worker leaves an entry in torch's cache
    of shared storages (``torch.multiprocessing.reductions.shared_cache``), dropped only
    when the cache grows. Entries left at the interpreter's exit are finalised after
    the torch modules they need, each printing "Exception ignored in
    StorageWeakRef.__del__". Drop them after each module, while torch is whole."""
    yield
    reductions = sys.modules.get("torch.multiprocessing.reductions")
    if reductions is not None:
        gc.collect()
        reductions.shared_cache.free_dead_references()
