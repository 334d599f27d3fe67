"""The one atomic, private file writer."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainmedic.atomicfile import atomic_writer, write_atomic


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_files_are_private_and_whole(tmp_path: Path) -> None:
    target = tmp_path / "findings.json"
    write_atomic(target, '{"a": 1}\n')
    assert target.read_text() == '{"a": 1}\n'
    assert mode_of(target) == 0o600
    assert os.listdir(tmp_path) == ["findings.json"]


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "attempt.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["attempt.json"]


def test_keep_mode_keeps_the_replaced_files_permissions(tmp_path: Path) -> None:
    target = tmp_path / "export.html"
    target.write_text("old")
    target.chmod(0o644)
    write_atomic(target, b"new", keep_mode=True)
    assert target.read_bytes() == b"new"
    assert mode_of(target) == 0o644
    write_atomic(target, "newer")
    assert mode_of(target) == 0o600


def test_text_that_is_not_utf8_is_escaped_not_refused(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_atomic(target, "path \udcff")
    assert target.read_bytes() == b"path \\udcff"


def test_a_long_target_name_still_gets_a_temporary(tmp_path: Path) -> None:
    target = tmp_path / ("x" * 250)
    write_atomic(target, "ok")
    assert target.read_text() == "ok"


def test_an_unwritable_directory_raises_oserror_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "f.json", "x")
    assert os.listdir(tmp_path) == []
