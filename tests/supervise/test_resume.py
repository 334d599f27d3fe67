"""Where a restarted job resumes, and the arguments that tell it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from trainmedic.errors import UsageError
from trainmedic.supervise.loop.resume import (
    ResumePoint,
    checkpoint_dir,
    newest_checkpoint,
    newest_checkpointer_checkpoint,
    newest_glob_checkpoint,
    parse_resume_template,
    resume_arguments,
)


def make_checkpoint(directory: Path, sequence: int, step: int, data: bytes) -> Path:
    """A committed Checkpointer checkpoint: data file plus manifest, as checkpoint.py writes."""
    directory.mkdir(exist_ok=True)
    stem = f"ckpt-{sequence:06d}-step{step}"
    (directory / f"{stem}.pt").write_bytes(data)
    manifest = {
        "format": "trainmedic-checkpoint",
        "version": 1,
        "sequence": sequence,
        "step": step,
        "data_file": f"{stem}.pt",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (directory / f"{stem}.json").write_text(json.dumps(manifest))
    return directory / f"{stem}.pt"


def test_the_template_is_split_like_a_shell_and_filled_in() -> None:
    template = parse_resume_template("--resume {checkpoint} --start-step={step} 'a b'")
    assert template == ("--resume", "{checkpoint}", "--start-step={step}", "a b")
    point = ResumePoint(Path("/c/ckpt-30.pt"), 30, "glob")
    assert resume_arguments(template, point) == [
        "--resume",
        "/c/ckpt-30.pt",
        "--start-step=30",
        "a b",
    ]


@pytest.mark.parametrize("bad", ["--resume {ckpt}", "", "--resume 'unclosed"])
def test_a_bad_template_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_resume_template(bad)


def test_the_newest_valid_checkpointer_checkpoint_is_chosen(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    make_checkpoint(directory, 1, 10, b"ten")
    twenty = make_checkpoint(directory, 2, 20, b"twenty")
    newest = make_checkpoint(directory, 3, 30, b"thirty")
    assert newest_checkpointer_checkpoint(directory) == ResumePoint(newest, 30, "checkpointer")
    newest.write_bytes(b"thirtY")  # corrupted, same size: the hash tells
    assert newest_checkpointer_checkpoint(directory) == ResumePoint(twenty, 20, "checkpointer")
    assert newest_checkpointer_checkpoint(tmp_path / "none") is None


def test_a_glob_picks_the_most_recent_file_and_reads_its_step(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    older = tmp_path / "run" / "model_step200.pt"
    newer = tmp_path / "run" / "model_step100.pt"  # written last: a restart from 100
    older.write_bytes(b"x")
    newer.write_bytes(b"y")
    (tmp_path / "run" / "model_step999.pt").write_bytes(b"")  # empty: an interrupted save
    os.utime(older, (1000, 1000))
    os.utime(newer, (2000, 2000))
    assert newest_glob_checkpoint("run/*.pt", str(tmp_path)) == ResumePoint(newer, 100, "glob")
    assert newest_glob_checkpoint("nothing/*.pt", str(tmp_path)) is None
    assert newest_checkpoint(tmp_path, "run/*.pt", str(tmp_path)) == ResumePoint(newer, 100, "glob")


def test_the_jobs_own_checkpoint_directory_wins(tmp_path: Path) -> None:
    assert checkpoint_dir(tmp_path, {}) == tmp_path / "checkpoints"
    own = {"TRAINMEDIC_CHECKPOINT_DIR": "/data/ckpt"}
    assert checkpoint_dir(tmp_path, own) == Path("/data/ckpt")


def test_a_glob_over_too_many_paths_is_cut_and_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for i in range(30):
        (run / f"ckpt_{i:03d}.pt").write_bytes(b"x")
    point = newest_glob_checkpoint("run/*.pt", str(tmp_path), max_matches=10)
    assert point is not None and point.cut is not None and "over 10 paths" in point.cut
    whole = newest_glob_checkpoint("run/*.pt", str(tmp_path))
    assert whole is not None and whole.cut is None


def test_a_glob_that_takes_too_long_is_cut_by_the_clock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for i in range(5):
        (run / f"ckpt_{i}.pt").write_bytes(b"x")
    ticks = iter(range(100))
    point = newest_glob_checkpoint(
        "run/*.pt", str(tmp_path), max_s=2.5, clock=lambda: float(next(ticks))
    )
    assert point is not None and point.cut == "--checkpoint-glob was searched for 2.5 s: narrow it"
