"""Run directories: a readable default name, and never a user's files overwritten."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from trainmedic.errors import RunDirectoryError
from trainmedic.supervise.rundir import (
    LOCK_FILE,
    command_name,
    default_run_dir,
    prepare_run_dir,
    release,
    remove_unused,
)


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "train.py", "--lr", "3"], "train"),
        (["python3.11", "-u", "scripts/fine_tune.py"], "fine_tune"),
        (["python", "-m", "pkg.train", "--epochs", "2"], "pkg.train"),
        (["torchrun", "--nproc-per-node", "2", "train_ddp.py"], "train_ddp"),
        (["accelerate", "launch", "--num_processes", "2", "main.py"], "main"),
        (["/usr/bin/make", "train"], "make"),
        (["python", "-c", "print(1)"], "python-c"),
        (["my tool!"], "my-tool"),
    ],
)
def test_command_name(argv: list[str], name: str) -> None:
    assert command_name(argv) == name


def test_default_run_dir_is_timestamped_and_never_reused(tmp_path: Path) -> None:
    now = 1_700_000_000.0
    first = default_run_dir(["python", "train.py"], now=now, base=tmp_path)
    assert first.parent == tmp_path
    assert first.name.endswith("-train") and first.name[:8].isdigit()
    first.mkdir()
    second = default_run_dir(["python", "train.py"], now=now, base=tmp_path)
    assert second.name == first.name + "-2"


def test_prepare_creates_a_private_directory(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "a"
    assert prepare_run_dir(target).created is True
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_an_empty_existing_directory_is_used(tmp_path: Path) -> None:
    assert prepare_run_dir(tmp_path).created is False


def test_a_directory_with_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError, match="not empty"):
        prepare_run_dir(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(RunDirectoryError, match="not a directory"):
        prepare_run_dir(target)


# --- one run per directory ----------------------------------------------------------------


def _at_once(n: int, work: Callable[[], Path]) -> tuple[list[Path], list[str]]:
    """``work`` in ``n`` threads released together: what each reserved, or its refusal."""
    barrier = threading.Barrier(n)
    got: list[Path] = []
    refused: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        try:
            path = work()
        except RunDirectoryError as exc:
            with lock:
                refused.append(str(exc))
        else:
            with lock:
                got.append(path)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, refused


def test_one_explicit_directory_goes_to_one_run_of_many_started_at_once(tmp_path: Path) -> None:
    for trial in range(20):
        for existing in (False, True):  # to be created, or given empty by the user
            target = tmp_path / f"t{trial}-{existing}"
            if existing:
                target.mkdir()
            got, refused = _at_once(6, lambda t=target: prepare_run_dir(t).path)
            assert got == [target], (got, refused)
            assert len(refused) == 5 and all(
                "another run" in r and "--out" in r for r in refused
            ), refused
            assert (target / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_default_directories_started_in_one_second_are_all_different(tmp_path: Path) -> None:
    first = default_run_dir(["python", "train.py"], now=1_700_000_000.0, base=tmp_path / "runs")
    got, refused = _at_once(6, lambda: prepare_run_dir(first, default=True).path)
    assert refused == [] and len(set(got)) == 6
    assert sorted(p.name for p in got) == sorted(
        [first.name] + [f"{first.name}-{n}" for n in range(2, 7)]
    )
    # The base directory trainmedic made is private too, like each run's own.
    assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == 0o700


def test_a_run_starting_in_a_reserved_directory_names_the_other_run(tmp_path: Path) -> None:
    prepared = prepare_run_dir(tmp_path / "x")
    with pytest.raises(RunDirectoryError, match=rf"another run \(trainmedic pid {os.getpid()}\)"):
        prepare_run_dir(tmp_path / "x")
    release(prepared)
    assert list((tmp_path / "x").iterdir()) == []
    again = prepare_run_dir(tmp_path / "x")  # given up before any record: usable again
    assert again.created is False
    remove_unused(again)  # the user's (now) empty directory stays, without the lock
    assert list((tmp_path / "x").iterdir()) == []
    fresh = prepare_run_dir(tmp_path / "y")
    remove_unused(fresh)  # one it made is removed whole
    assert not (tmp_path / "y").exists()
