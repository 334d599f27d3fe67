"""A bounded local cache for slow or remote data, safe to fill from many processes at once.

The first epoch reads through to the source (a network filesystem, HTTP,
object storage); later epochs read local disk. :class:`LocalCache` stores
bytes under a key (a URL, a path): each entry is one file named by the
SHA-256 of its key (content addressing by key), written to a private
temporary file and renamed into place, so a reader sees a whole entry or
none. A per-key lock (``flock``) makes concurrent processes — DataLoader
workers, ranks on the same node — fetch a missing entry once; the others wait
and read it. Size is bounded: a small ledger file, updated under a lock,
counts the bytes stored, and inserts past ``max_bytes`` evict the least
recently used entries (by modification time, which a hit refreshes) down to
90 %. An entry evicted while another process reads it stays readable to that
reader (POSIX unlink); an entry that vanished between lookup and open is
fetched again.

:class:`CachedFiles` adapts it to file paths (``open(path, "rb").read()`` of a
slow filesystem), :class:`CachedDataset` to deterministic datasets: it caches
each *sample* (pickled), which is only right when ``dataset[i]`` is the same
every epoch — random augmentations belong after the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainmedic.atomicfile import atomic_writer, write_atomic
from trainmedic.errors import UsageError
from trainmedic.remedies.wrapper import DatasetWrapper

_LEDGER = ".ledger"
_LOCK = ".lock"
_LOW_WATER = 0.9


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class LocalCache:
    """Bytes by key on local disk, bounded, shared by processes.

    Args:
        directory: where entries live (created 0700); put it on a local SSD or
            in ``/dev/shm``, never on the slow filesystem itself.
        max_bytes: bound on the bytes stored; oldest entries are evicted past it.
        clock: Unix time in seconds (entries' use times).

    Attributes:
        hits / misses / fetched_bytes: this process's counts.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_bytes <= 0:
            raise UsageError(f"max_bytes must be > 0, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.clock = clock
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.directory / "locks").mkdir(mode=0o700, exist_ok=True)
        self.hits = 0
        self.misses = 0
        self.fetched_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["hits"] = state["misses"] = state["fetched_bytes"] = 0
        return state

    def path_for(self, key: str) -> Path:
        """The file that holds ``key``'s entry (it may not exist)."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
        return self.directory / digest[:2] / digest

    def get(self, key: str, fetch: Callable[[], bytes]) -> bytes:
        """``key``'s bytes: from disk when cached, else ``fetch()``-ed and stored."""
        path = self.path_for(key)
        data = self._read(path)
        if data is not None:
            self.hits += 1
            return data
        lock = self.directory / "locks" / path.name
        with _locked(lock):
            data = self._read(path)  # another process may have filled it meanwhile
            if data is not None:
                self.hits += 1
                return data
            self.misses += 1
            data = fetch()
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"fetch for {key!r} returned {type(data).__name__}, not bytes")
            data = bytes(data)
            self.fetched_bytes += len(data)
            if len(data) <= self.max_bytes:
                self._store(path, data)
        with contextlib.suppress(OSError):
            lock.unlink()
        return data

    def _read(self, path: Path) -> bytes | None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        now = self.clock()
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))  # recently used: evicted last
        return data

    def _store(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        # Scratch copies: no fsync (a lost entry is fetched again). The data is
        # written before the cache lock is taken; the lock is held from just
        # before the rename until the ledger counts the new entry.
        with contextlib.ExitStack() as lock:
            with atomic_writer(path, binary=True, durable=False) as f:
                f.write(data)
                lock.enter_context(_locked(self.directory / _LOCK))
                stored = self._ledger()  # before the new entry is in place
                replaced = path.stat().st_size if path.exists() else 0
            now = self.clock()
            os.utime(path, (now, now))
            total = stored + len(data) - replaced
            if total > self.max_bytes:
                total = self._evict(int(self.max_bytes * _LOW_WATER), keep=path)
            self._write_ledger(total)

    # --- size bound (called with the cache lock held) --------------------------------------------

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        for sub in self.directory.iterdir():
            if not sub.is_dir() or sub.name == "locks":
                continue
            for entry in sub.iterdir():
                if entry.name.startswith("."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    out.append((st.st_mtime, st.st_size, entry))
        return out

    def _evict(self, target: int, keep: Path) -> int:
        entries = sorted(self._entries(), key=lambda e: e[0])
        total = sum(size for _, size, _ in entries)
        for _, size, entry in entries:
            if total <= target:
                break
            if entry == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                total -= size
        return total

    def _ledger(self) -> int:
        try:
            return int((self.directory / _LEDGER).read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return sum(size for _, size, _ in self._entries())

    def _write_ledger(self, total: int) -> None:
        write_atomic(self.directory / _LEDGER, str(max(0, total)), durable=False)

    def size_bytes(self) -> int:
        """Bytes stored now, counted on disk."""
        return sum(size for _, size, _ in self._entries())


class CachedFiles:
    """Whole-file reads of a slow filesystem through a :class:`LocalCache`:
    ``CachedFiles(cache).read(path)`` instead of ``open(path, "rb").read()``."""

    def __init__(self, cache: LocalCache) -> None:
        self.cache = cache

    def read(self, path: str | os.PathLike[str]) -> bytes:
        source = os.fspath(path)

        def fetch() -> bytes:
            with open(source, "rb") as f:
                return f.read()

        return self.cache.get(f"file:{os.path.abspath(source)}", fetch)


class CachedDataset(DatasetWrapper):
    """A deterministic map-style dataset with every sample cached after its first read.

    Only right when ``dataset[i]`` is the same every epoch: apply random
    augmentations after it (``namespace`` tells apart datasets sharing a cache).
    """

    def __init__(self, dataset: Any, cache: LocalCache, *, namespace: str = "") -> None:
        self.dataset = dataset
        self.cache = cache
        self.namespace = namespace or f"{type(dataset).__module__}.{type(dataset).__qualname__}"

    def __getitem__(self, index: int) -> Any:
        def fetch() -> bytes:
            return pickle.dumps(self.dataset[index], protocol=pickle.HIGHEST_PROTOCOL)

        data = self.cache.get(f"sample:{self.namespace}:{len(self.dataset)}:{index}", fetch)
        return pickle.loads(data)
