"""Atomic, private file writes: the one way trainmedic replaces a file.

A file trainmedic writes is either the whole old one or the whole new one,
never a torn mix, whatever happens to the process (SIGKILL, full disk, a
crash mid-write): the content goes to a temporary file in the same
directory, is flushed and ``fsync``-ed, given its permissions, and renamed
over the target; the directory is ``fsync``-ed after the rename so the
rename itself survives a power loss. On any failure the temporary file is
removed and the target is untouched.

New files are private (``0o600``): run records hold the job's command line,
paths and stacks. ``keep_mode=True`` keeps the permissions of a file being
replaced (a user's own export target).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal, overload

PRIVATE = 0o600
"""Permissions of every file trainmedic creates."""


@overload
def atomic_writer(
    path: str | os.PathLike[str],
    *,
    binary: Literal[False] = ...,
    mode: int = ...,
    keep_mode: bool = ...,
    durable: bool = ...,
) -> contextlib.AbstractContextManager[IO[str]]: ...


@overload
def atomic_writer(
    path: str | os.PathLike[str],
    *,
    binary: Literal[True],
    mode: int = ...,
    keep_mode: bool = ...,
    durable: bool = ...,
) -> contextlib.AbstractContextManager[IO[bytes]]: ...


def atomic_writer(
    path: str | os.PathLike[str],
    *,
    binary: bool = False,
    mode: int = PRIVATE,
    keep_mode: bool = False,
    durable: bool = True,
) -> contextlib.AbstractContextManager[IO[str]] | contextlib.AbstractContextManager[IO[bytes]]:
    """A file to write ``path``'s new content into; it replaces ``path`` when the
    ``with`` block ends without an exception, and never otherwise.

    Text is UTF-8, with bytes that are not (surrogates from odd file names or
    output) written as backslash escapes rather than failing the write.

    Args:
        binary: yield a binary file instead of a text one.
        mode: permissions of the new file.
        keep_mode: keep the permissions of the file being replaced, if any.
        durable: ``fsync`` the file and the directory (off only for scratch
            files whose loss on power failure does not matter).
    """
    # The two overloads above give callers the precise file type.
    return _writer(Path(path), binary, mode, keep_mode, durable)  # type: ignore[return-value]


@contextlib.contextmanager
def _writer(
    target: Path, binary: bool, mode: int, keep_mode: bool, durable: bool
) -> Iterator[IO[str] | IO[bytes]]:
    if keep_mode:
        with contextlib.suppress(OSError):
            mode = stat.S_IMODE(target.stat().st_mode)
    # The name stays under the usual 255-byte limit whatever the target's length.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:200]}.", suffix=".tmp", dir=target.parent)
    try:
        if binary:
            f: IO[str] | IO[bytes] = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")
        with f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)


def write_atomic(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    mode: int = PRIVATE,
    keep_mode: bool = False,
    durable: bool = True,
) -> None:
    """Replace ``path`` with ``data`` (see :func:`atomic_writer`).

    Raises:
        OSError: it could not be written; ``path`` is as it was.
    """
    if isinstance(data, bytes):
        with atomic_writer(path, binary=True, mode=mode, keep_mode=keep_mode, durable=durable) as b:
            b.write(data)
    else:
        with atomic_writer(path, mode=mode, keep_mode=keep_mode, durable=durable) as t:
            t.write(data)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make renames in directory ``path`` durable; silently nothing where a
    filesystem refuses to open or sync a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
