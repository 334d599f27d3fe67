"""Where a run's record goes: the default name, and never reusing a user's directory.

A run directory is new, or an existing empty directory. One that holds an
earlier run's record is refused with a message that says so (and whether that
run's supervisor was killed before it could finish the record: its
``probe.sock`` is still there); trainmedic never writes into a record twice.

Two runs started at once must not share one: a run *reserves* its directory
by creating :data:`LOCK_FILE` in it with ``O_EXCL`` (one creator wins, on any
local filesystem) before it writes anything, and removes it when the record
is closed. The loser of an explicit ``--out`` is refused; a default directory
(two runs of one command in the same second) moves on to the next free name.
"""

from __future__ import annotations

import contextlib
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
LOCK_FILE = ".trainmedic-run.lock"
"""Created exclusively in a run directory while a run is in it; holds the supervisor's pid."""
MAX_DEFAULT_TRIES = 1000
"""Names tried for a default directory before giving up."""
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
    lock: Path | None = None


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
    if LOCK_FILE in entries and META_FILE not in entries:
        raise RunDirectoryError(_in_use(path, shown))
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


def prepare_run_dir(path: Path, default: bool = False) -> PreparedRunDir:
    """Make ``path`` ready for a new run; refuse anything already holding files.

    A new directory (and any missing parent) is created with mode 0700. An
    existing empty one keeps its mode: it is the user's; everything trainmedic
    puts in it is private (0600 files, 0700 directories), and when others may
    list it, the returned note says so.

    The directory is reserved (:data:`LOCK_FILE`) before this returns; a run that
    another reserved meanwhile is refused, or, for a ``default`` name, the next
    free name is taken (``-2``, ``-3``, ...).

    Raises:
        RunDirectoryError: see :func:`check_run_dir`; or it cannot be created.
    """
    if not default:
        return _prepare(path, default=False)
    first = path
    for n in range(2, MAX_DEFAULT_TRIES + 2):
        try:
            return _prepare(path, default=True)
        except _Taken:
            path = first.with_name(f"{first.name}-{n}")
    raise RunDirectoryError(f"no free run directory next to {printable(str(first))}")


class _Taken(RunDirectoryError):
    """A default directory another run created or reserved first."""


def _prepare(path: Path, default: bool) -> PreparedRunDir:
    shown = printable(str(path))
    if default:
        # A default name is only ever new: one that exists (another run's, made a moment
        # ago) is taken, and the mkdir below decides a race for it.
        if path.exists() or path.is_symlink():
            raise _Taken(shown)
    else:
        check_run_dir(path)
    if not default and path.is_dir():
        mode = stat.S_IMODE(path.stat().st_mode)
        note = None
        if mode & 0o077:
            note = (
                f"--out {shown} is readable by others (mode {mode:04o}); it keeps its mode, "
                "and the run's files in it are private (0600)"
            )
        lock = _reserve(path, default)
        return PreparedRunDir(path, created=False, note=note, lock=lock)
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    what = "the run directory" if default else f"--out {shown}"
    try:
        for directory in reversed(missing):  # private, like the run's own directory
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o700)
                os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        path.mkdir(mode=0o700, exist_ok=False)
        os.chmod(path, 0o700)
    except FileExistsError:
        if default:
            raise _Taken(shown) from None
        raise RunDirectoryError(
            f"--out {shown}: another run created it just now (choose a new directory)"
        ) from None
    except OSError as exc:
        raise RunDirectoryError(f"{what} {shown}: cannot create: {exc.strerror or exc}") from None
    lock = _reserve(path, default)
    return PreparedRunDir(
        path, created=True, created_parents=tuple(reversed(missing)), lock=lock
    )


def _reserve(path: Path, default: bool) -> Path:
    """Create :data:`LOCK_FILE` in ``path`` exclusively, or say who has the directory."""
    lock = path / LOCK_FILE
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    shown = printable(str(path))
    try:
        fd = os.open(lock, flags, 0o600)
    except FileExistsError:
        if default:
            raise _Taken(shown) from None
        raise RunDirectoryError(_in_use(path, shown)) from None
    except OSError as exc:
        raise RunDirectoryError(
            f"run directory {shown}: cannot be written: {exc.strerror or exc}"
        ) from None
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return lock


def _in_use(path: Path, shown: str) -> str:
    """The refusal of a directory another run reserved, naming that run's supervisor."""
    try:
        holder = (path / LOCK_FILE).read_text(encoding="ascii", errors="replace").strip()[:20]
    except OSError:
        holder = "?"
    return (
        f"--out {shown}: another run (trainmedic pid {holder}) is using it "
        "(choose a new directory)"
    )


def release(prepared: PreparedRunDir) -> None:
    """Give the directory up: the run's record is closed (or was never begun)."""
    if prepared.lock is not None:
        with contextlib.suppress(OSError):
            prepared.lock.unlink()


def remove_unused(prepared: PreparedRunDir) -> None:
    """Remove the directories :func:`prepare_run_dir` created, when they are empty."""
    release(prepared)
    own = (prepared.path,) if prepared.created else ()
    for directory in (*own, *reversed(prepared.created_parents)):
        try:
            directory.rmdir()
        except OSError:
            return
