"""Which version of the training script a run ran: its path, a hash of its bytes and,
inside a git work tree, the commit and whether the file differed from it.

Read once as the job starts (the file may be edited while it trains), for
``trainmedic compare``: two runs of different script versions differ by more than
their command lines say. Reading is bounded (size, time) and never fails a run.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_BYTES = 16 << 20
"""Scripts larger than this (bytes) are not hashed."""
GIT_TIMEOUT_S = 2.0


def script_path(argv: Sequence[str], cwd: Path) -> Path | None:
    """The first ``*.py`` argument of the command, as a path from ``cwd`` (``python
    train.py``, ``torchrun ... train.py``, ``env X=1 python train.py``), if it is a file."""
    for arg in argv[1:] if argv else ():
        if arg.endswith(".py") and not arg.startswith("-"):
            path = Path(arg) if Path(arg).is_absolute() else cwd / arg
            return path if path.is_file() else None
    return None


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def script_facts(argv: Sequence[str], cwd: Path) -> dict[str, Any] | None:
    """``{"path", "sha256", "git_commit", "git_modified"}`` of the command's script
    (what could be read), or ``None`` when the command names no script file."""
    path = script_path(argv, cwd)
    if path is None:
        return None
    facts: dict[str, Any] = {"path": str(path)}
    try:
        if path.stat().st_size <= MAX_BYTES:
            facts["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        pass
    commit = _git(path.parent, "rev-parse", "HEAD")
    if commit:
        facts["git_commit"] = commit
        status = _git(path.parent, "status", "--porcelain", "--", path.name)
        if status is not None:
            facts["git_modified"] = bool(status)
    return facts
