"""Where a run's record goes: the default name, and never reusing a user's directory."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from trainmedic.errors import RunDirectoryError

DEFAULT_BASE = Path("trainmedic-runs")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 48


def command_name(argv: Sequence[str]) -> str:
    """A short name for the command: the script's stem, the ``-m`` module, or the program.

    ``python train.py`` -> ``train``; ``torchrun --nproc-per-node 2 train.py``
    -> ``train``; ``python -m pkg.train`` -> ``pkg.train``; ``make`` -> ``make``.
    """
    if not argv:
        return "run"
    args = list(argv)
    name = ""
    for i, arg in enumerate(args[1:], start=1):
        if arg == "-m" and i + 1 < len(args):
            name = args[i + 1]
            break
        if arg.endswith(".py") and not arg.startswith("-"):
            name = Path(arg).stem
            break
    if not name:
        prog = Path(args[0]).name
        name = prog
        if _PYTHON.match(prog) and len(args) > 1 and args[1] == "-c":
            name = "python-c"
    cleaned = _UNSAFE.sub("-", name).strip("-.") or "run"
    return cleaned[:_MAX_NAME]


def default_run_dir(
    argv: Sequence[str], now: float | None = None, base: Path = DEFAULT_BASE
) -> Path:
    """``base/<YYYYmmdd-HHMMSS>-<name>``, with ``-2``, ``-3``... when that exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    first = base / f"{stamp}-{command_name(argv)}"
    candidate = first
    n = 2
    while candidate.exists():
        candidate = first.with_name(f"{first.name}-{n}")
        n += 1
    return candidate


def prepare_run_dir(path: Path) -> bool:
    """Create ``path`` (mode 0700) for a new run; refuse anything already holding files.

    Returns whether the directory was created (``False``: it existed, empty).

    Raises:
        RunDirectoryError: ``path`` is a file, a non-empty directory, or cannot be created.
    """
    existed = path.exists()
    if existed or path.is_symlink():
        if not path.is_dir():
            raise RunDirectoryError(f"--out {path}: exists and is not a directory")
        if any(path.iterdir()):
            raise RunDirectoryError(
                f"--out {path}: directory is not empty (trainmedic never overwrites files; "
                "choose a new directory)"
            )
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise RunDirectoryError(f"--out {path}: cannot create: {exc.strerror or exc}") from exc
    return not existed
