"""The local cache: read-through, bounded, and safe when processes fill it at once."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from trainmedic.errors import UsageError
from trainmedic.remedies.cache import CachedDataset, CachedFiles, LocalCache


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_first_read_fetches_and_later_reads_come_from_disk(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", max_bytes=10_000)
    fetched: list[str] = []

    def fetch() -> bytes:
        fetched.append("x")
        return b"payload"

    assert cache.get("http://data/a", fetch) == b"payload"
    assert cache.get("http://data/a", fetch) == b"payload"
    assert fetched == ["x"]
    assert (cache.hits, cache.misses, cache.fetched_bytes) == (1, 1, 7)
    assert cache.path_for("http://data/a").read_bytes() == b"payload"
    assert oct(cache.path_for("http://data/a").stat().st_mode & 0o777) == "0o600"


def test_the_least_recently_used_entries_go_when_the_bound_is_passed(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", max_bytes=3000, clock=Clock())
    for key in "abc":
        cache.get(key, lambda: b"." * 1000)
    cache.get("a", lambda: pytest.fail("a is cached"))  # a is now the most recent
    cache.get("d", lambda: b"." * 1000)  # 4000 > 3000: evict down to 2700
    assert cache.size_bytes() <= 3000
    assert cache.path_for("a").exists() and cache.path_for("d").exists()
    assert not cache.path_for("b").exists()  # the oldest
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "c").rglob("*"))


def test_an_entry_larger_than_the_cache_is_passed_through_not_stored(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", max_bytes=10)
    assert cache.get("big", lambda: b"x" * 11) == b"x" * 11
    assert not cache.path_for("big").exists()


def test_bad_arguments_and_bad_fetches(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        LocalCache(tmp_path, max_bytes=0)
    cache = LocalCache(tmp_path / "c", max_bytes=100)
    with pytest.raises(TypeError, match="not bytes"):
        cache.get("k", lambda: "text")  # type: ignore[arg-type,return-value]


def test_cached_files_read_a_slow_filesystem_once(tmp_path: Path) -> None:
    source = tmp_path / "remote.bin"
    source.write_bytes(b"abc")
    files = CachedFiles(LocalCache(tmp_path / "c", max_bytes=100))
    assert files.read(source) == b"abc"
    source.write_bytes(b"changed")  # a cache never looks again: data sets are read-only
    assert files.read(source) == b"abc"


def test_a_cached_dataset_returns_the_same_samples() -> None:
    class Squares:
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> dict[str, int]:
            return {"x": i * i}

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ds = CachedDataset(Squares(), LocalCache(d, max_bytes=10_000))
        assert [ds[i]["x"] for i in range(5)] == [0, 1, 4, 9, 16]
        assert [ds[i]["x"] for i in range(5)] == [0, 1, 4, 9, 16]
        assert ds.cache.misses == 5 and ds.cache.hits == 5


def _fill(
    directory: str, keys: list[str], log: str, barrier: multiprocessing.synchronize.Barrier
) -> None:
    cache = LocalCache(directory, max_bytes=1 << 20)
    barrier.wait()
    for key in keys:

        def fetch(key: str = key) -> bytes:
            with open(log, "a") as f:  # one line per real fetch, any process
                f.write(f"{key}\n")
            return key.encode() * 1000

        assert cache.get(key, fetch) == key.encode() * 1000


def test_processes_filling_at_once_fetch_each_entry_once_and_never_see_half_an_entry(
    tmp_path: Path,
) -> None:
    ctx = multiprocessing.get_context("fork")
    keys = [f"key-{i:02d}" for i in range(24)]
    log = tmp_path / "fetches.log"
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(
            target=_fill, args=(str(tmp_path / "c"), keys[i:] + keys[:i], str(log), barrier)
        )
        for i in (0, 6, 12, 18)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert sorted(log.read_text().split()) == keys  # each key fetched by one process only
    cache = LocalCache(tmp_path / "c", max_bytes=1 << 20)
    assert cache.size_bytes() == sum(len(k) * 1000 for k in keys)
    leftovers = [p for p in (tmp_path / "c").rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    assert int((tmp_path / "c" / ".ledger").read_text()) == cache.size_bytes()
    assert os.stat(tmp_path / "c").st_mode & 0o777 == 0o700
