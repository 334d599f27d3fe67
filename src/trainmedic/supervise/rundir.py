"""Where a run's record goes: the default name, and never reusing a user's directory.

A run directory is new, or an existing empty directory. One that holds an
earlier run's record is refused with a message that says so (and whether that
run's supervisor was killed before it could finish the record: its
``probe.sock`` is still there); trainmedic never writes into a record twice.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmedic.channel.server import SOCKET_NAME
from trainmedic.errors import RunDirectoryError
from trainmedic.ostext import path_problem, printable
from trainmedic.record.store import META_FILE

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


@dataclass(frozen=True)
class PreparedRunDir:
    """A run directory made ready for a run.

    Attributes:
        created: ``path`` was created for this run (``False``: it existed, empty).
        created_parents: missing parent directories created on the way, the
            outermost first (removed again, when empty, if the job never starts).
        note: one line to show the person, or ``None``: an existing directory
            other users may read keeps its mode (its files are private anyway).
    """

    path: Path
    created: bool
    created_parents: tuple[Path, ...] = ()
    note: str | None = None


def check_run_dir(path: Path) -> None:
    """Refuse a path that cannot be a new run's directory, creating nothing.

    Raises:
        RunDirectoryError: an impossible name, a file, or a directory holding
            files (an earlier run's record is named as such).
    """
    shown = printable(str(path))
    problem = path_problem(path)
    if problem:
        raise RunDirectoryError(f"--out {shown}: {problem}")
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise RunDirectoryError(
                f"--out {shown}: is a symbolic link to {printable(os.readlink(path))}, "
                "which does not exist"
            ) from None
        return
    except OSError as exc:
        raise RunDirectoryError(f"--out {shown}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirectoryError(f"--out {shown}: exists and is not a directory")
    try:
        entries = {entry.name for entry in os.scandir(path)}
    except OSError as exc:
        raise RunDirectoryError(f"--out {shown}: cannot be read: {exc.strerror or exc}") from None
    if META_FILE in entries:
        raise RunDirectoryError(
            f"--out {shown}: holds the record of an earlier run"
            + (" whose supervisor did not finish it" if SOCKET_NAME in entries else "")
            + f" (see it with 'trainmedic report {shown}'; trainmedic never writes over a "
            "record: choose a new directory)"
        )
    if entries:
        raise RunDirectoryError(
            f"--out {shown}: directory is not empty (trainmedic never overwrites files; "
            "choose a new directory)"
        )


def prepare_run_dir(path: Path) -> PreparedRunDir:
    """Make ``path`` ready for a new run; refuse anything already holding files.

    A new directory (and any missing parent) is created with mode 0700. An
    existing empty one keeps its mode: it is the user's; everything trainmedic
    puts in it is private (0600 files, 0700 directories), and when others may
    list it, the returned note says so.

    Raises:
        RunDirectoryError: see :func:`check_run_dir`; or it cannot be created.
    """
    check_run_dir(path)
    shown = printable(str(path))
    if path.is_dir():
        mode = stat.S_IMODE(path.stat().st_mode)
        note = None
        if mode & 0o077:
            note = (
                f"--out {shown} is readable by others (mode {mode:04o}); it keeps its mode, "
                "and the run's files in it are private (0600)"
            )
        return PreparedRunDir(path, created=False, note=note)
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=False)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        raise RunDirectoryError(f"--out {shown}: was created by someone else meanwhile") from None
    except OSError as exc:
        raise RunDirectoryError(f"--out {shown}: cannot create: {exc.strerror or exc}") from None
    return PreparedRunDir(path, created=True, created_parents=tuple(reversed(missing)))


def remove_unused(prepared: PreparedRunDir) -> None:
    """Remove the directories :func:`prepare_run_dir` created, when they are empty."""
    own = (prepared.path,) if prepared.created else ()
    for directory in (*own, *reversed(prepared.created_parents)):
        try:
            directory.rmdir()
        except OSError:
            return
