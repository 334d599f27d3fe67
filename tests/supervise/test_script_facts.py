"""The training script's identity as a run starts: which argument is the script, its
hash, and inside git the commit and whether the file differs from it."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from trainmedic.supervise.script_facts import script_facts, script_path


def test_the_script_is_the_first_python_file_argument(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    assert script_path(["python", "train.py", "--lr", "x.py"], tmp_path) == tmp_path / "train.py"
    assert script_path(["torchrun", "--nproc-per-node", "2", "train.py"], tmp_path) == (
        tmp_path / "train.py")  # fmt: skip
    assert script_path(["env", "A=1", "python", str(tmp_path / "train.py")], Path("/")) == (
        tmp_path / "train.py")  # fmt: skip
    # No file, a module, or no arguments: no script.
    assert script_path(["python", "missing.py"], tmp_path) is None
    assert script_path(["python", "-m", "pkg.train"], tmp_path) is None
    assert script_facts([], tmp_path) is None


def test_outside_git_the_hash_says_which_version(tmp_path: Path) -> None:
    body = b"print('train')\n"
    (tmp_path / "train.py").write_bytes(body)
    facts = script_facts(["python", "train.py"], tmp_path)
    assert facts == {"path": str(tmp_path / "train.py"),
                     "sha256": hashlib.sha256(body).hexdigest()}  # fmt: skip


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_inside_git_the_commit_and_whether_the_file_differs(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "train.py").write_text("print(1)\n")
    git("add", "train.py")
    git("commit", "-q", "-m", "one")
    facts = script_facts(["python", "train.py"], tmp_path)
    assert facts is not None
    assert facts["git_commit"] == git("rev-parse", "HEAD") and facts["git_modified"] is False
    (tmp_path / "train.py").write_text("print(2)\n")
    changed = script_facts(["python", "train.py"], tmp_path)
    assert changed is not None and changed["git_modified"] is True
    assert changed["sha256"] != facts["sha256"]
