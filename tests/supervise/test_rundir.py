"""Run directories: a readable default name, and never a user's files overwritten."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from trainmedic.errors import RunDirectoryError
from trainmedic.supervise.rundir import command_name, default_run_dir, prepare_run_dir


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
