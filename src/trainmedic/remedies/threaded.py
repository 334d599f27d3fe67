"""Worker threads for latency-bound datasets: fetch a batch's samples concurrently.

A dataset that waits (network, remote storage, a slow filesystem) needs many
samples in flight, not many cores: processes cost memory and start-up, threads
cost almost nothing while they wait. :class:`ThreadedFetch` gives a map-style
dataset ``__getitems__``, which the DataLoader calls with a whole batch of
indices; the samples are fetched by a thread pool, in order. Combine it with
worker processes for the CPU part: ``DataLoader(ThreadedFetch(ds, 8),
num_workers=2)`` keeps 16 samples in flight.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class ThreadedFetch:
    """``dataset`` with each batch fetched by ``threads`` threads (one pool per process).

    Attributes of the wrapped dataset stay reachable (``wrapped.classes``).
    """

    def __init__(self, dataset: Any, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.dataset = dataset
        self.threads = int(threads)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if self.threads == 1 or len(indices) <= 1:
            return [self.dataset[i] for i in indices]
        pool = self._pool
        if pool is None or self._pool_pid != os.getpid():  # a forked worker needs its own
            pool = ThreadPoolExecutor(self.threads, thread_name_prefix="trainmedic-fetch")
            self._pool, self._pool_pid = pool, os.getpid()
        return list(pool.map(self.dataset.__getitem__, indices))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None
        state["_pool_pid"] = 0
        return state

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
