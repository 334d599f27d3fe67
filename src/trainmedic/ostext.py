"""Text from the operating system (arguments, paths, the working directory) made safe to show.

On Linux, arguments and file names are bytes. Python hands undecodable bytes
over as lone surrogates (``surrogateescape``), which cannot be written as
UTF-8: printing them, or putting them in a JSON record, fails. The job always
gets the original bytes; what trainmedic shows and records is
:func:`printable`: each undecodable byte written as ``\\xNN``.

:func:`path_problem` says, before anything is created, why a path given on
the command line can never work (a name over the filesystem's limit).
"""

from __future__ import annotations

import os
import signal

NAME_MAX = 255
"""Longest file name (one path component) of Linux filesystems, bytes."""
PATH_MAX = 4096
"""Longest path the kernel accepts, bytes (including the final NUL)."""


def printable(text: str) -> str:
    """``text`` with undecodable bytes as ``\\xNN`` (and other lone surrogates as ``\\uNNNN``)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


def visible(text: str) -> str:
    """:func:`printable`, with control characters (ESC and the rest of C0 and C1, not tab
    and newline) as ``\\xNN``: text from a job's arguments or a foreign record never
    moves the cursor, retitles or recolours a person's terminal."""
    return printable(text).translate(_CONTROL)


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` can never be created or opened, or ``None``.

    ``"a name in it is 300 bytes long (the limit is 255)"``: checked against the
    limits of Linux filesystems, not the filesystem at hand.
    """
    raw = os.fsencode(path)
    if b"\0" in raw:
        return "it contains a NUL byte"
    if len(raw) >= PATH_MAX:
        return f"it is {len(raw)} bytes long (the limit is {PATH_MAX - 1})"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"a name in it is {longest} bytes long (the limit is {NAME_MAX}): file name too long"
    return None


def signal_name(signum: int) -> str:
    """A signal's name (``SIGKILL``), or ``signal N`` for a number without one."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
