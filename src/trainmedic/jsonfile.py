"""Bounded JSON reading: every JSON file or line trainmedic reads from the user goes through here.

A file a user hands trainmedic (a simulation file, a run record, a findings
document, a checkpoint manifest, an error file) may be anything: ``/dev/zero``,
a 4 GiB sparse file, ``[[[[...]]]]`` a hundred thousand levels deep. Reading
one must cost a bounded amount of memory and time and fail with a message
that says which limit was passed:

* :func:`read_limited` reads at most ``max_bytes`` (a regular file larger than
  that is refused from its size, before reading a byte);
* :func:`loads` refuses nesting deeper than ``max_depth`` before parsing (so
  neither the parser nor the code walking the result can run out of stack);
* :func:`read_json` is both; :func:`describe` turns any error they raise
  into the short text callers put in their own one-line error.

Errors are :class:`OSError` (the file), :class:`UnicodeDecodeError`,
:class:`json.JSONDecodeError` and :class:`JsonLimitError` — all but the first
are :class:`ValueError`, so a caller's ``except (OSError, ValueError)`` holds.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import select
import stat
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted; trainmedic's own files use under 10."""
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
"""Default size limit of a JSON document, bytes."""
MAX_RECORD_NUMBER = 1e18
"""Largest magnitude of a number in a run record (byte counts, seconds, rates all stay far
below); see :func:`loads`."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""Longest line of a JSON-lines file read back, bytes (trainmedic writes far shorter ones)."""
FIFO_WAIT_S = 10.0
"""How long a FIFO given as a file may stay silent before reading it fails, seconds."""
_CHUNK = 1024 * 1024
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_NOT_BRACKETS_OR_QUOTES = bytes(c for c in range(256) if c not in b'[]{}"')
_PASSES_MAX_BYTES = 4 * 1024 * 1024
"""Brackets beyond which the passes of :func:`check_depth` (each may remove as little
as one pair) could cost more than the exact scan."""


class JsonLimitError(ValueError):
    """A JSON text over a size or nesting limit; the message says which."""


def size_text(n: int) -> str:
    """``n`` bytes for a message: ``16 MiB``, ``512 KiB``, ``300 bytes``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def read_limited(
    path: str | os.PathLike[str] | bytes, max_bytes: int, fifo_wait_s: float = FIFO_WAIT_S
) -> bytes:
    """The contents of ``path``, refused past ``max_bytes``.

    Works on regular files, pipes and devices alike (``/dev/zero`` fails after
    ``max_bytes``; ``<(generate)`` works); a directory raises
    :class:`IsADirectoryError`, and a FIFO nobody writes to within
    ``fifo_wait_s`` seconds raises :class:`TimeoutError` instead of waiting
    forever.

    Raises:
        OSError: the file cannot be opened or read.
        JsonLimitError: it holds more than ``max_bytes`` bytes.
    """
    # Non-blocking open: a FIFO without a writer would block the open itself.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory", os.fsdecode(path))
        if stat.S_ISFIFO(st.st_mode):
            _await_writer(fd, fifo_wait_s)
        os.set_blocking(fd, True)
        if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
            raise JsonLimitError(
                f"larger than {size_text(max_bytes)} ({size_text(st.st_size)}); "
                "not a file trainmedic wrote"
            )
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            try:
                chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            except InterruptedError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise JsonLimitError(f"larger than {size_text(max_bytes)}; not a file trainmedic wrote")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _await_writer(fd: int, wait_s: float) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(max(0.0, wait_s) * 1000):
        raise TimeoutError(errno.ETIMEDOUT, f"a FIFO nothing was written to within {wait_s:g} s")


def check_depth(data: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`JsonLimitError` when arrays and objects nest deeper than ``max_depth``.

    Brackets inside strings do not count. Linear in ``len(data)`` (the passes
    over the brackets at most ``max_depth`` times a few MiB); a text with fewer
    brackets than ``max_depth`` is accepted without scanning.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return
    # The brackets alone, strings taken out, in C (without escapes, the quotes alone
    # say where strings are, so the rest can go first): each pass removes the innermost
    # pairs, one level of nesting, so a text no deeper than ``max_depth`` is empty
    # after that many passes. The supervisor reads every step of a job through
    # here (a line of steps holds an array per step), and a Python loop over each
    # bracket cost a tenth of its channel thread.
    if b"\\" in data:
        # An escape pairs a backslash with the byte after it: strings are found whole.
        skeleton = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    else:
        skeleton = _STRING.sub(b"", data.translate(None, _NOT_BRACKETS_OR_QUOTES))
    if len(skeleton) <= _PASSES_MAX_BYTES:
        for _ in range(max_depth):
            if not skeleton:
                return
            skeleton = _INNERMOST.sub(b"", skeleton)
        if not skeleton:
            return
    # Too deep, or brackets that do not pair (json.loads names that): the exact scan.
    depth = 0
    for m in _TOKEN.finditer(data):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                raise JsonLimitError(f"nested deeper than {max_depth} levels")
        elif c in (b"]", b"}"):
            depth -= 1


def loads(data: bytes | str, max_depth: int = MAX_DEPTH, *, max_number: float | None = None) -> Any:
    """Parse a JSON text (UTF-8 when bytes), refusing nesting past ``max_depth``.

    With ``max_number``, a number of larger magnitude, ``NaN`` and
    ``Infinity`` read as ``null``: a measurement no machine produces is a
    missing one (and never an ``OverflowError`` in the arithmetic after).

    Raises:
        UnicodeDecodeError, json.JSONDecodeError, JsonLimitError (all ValueError).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    check_depth(raw, max_depth)
    text = data if isinstance(data, str) else data.decode("utf-8")
    try:
        if max_number is None:
            return json.loads(text)
        return _bounded_decoder(max_number).decode(text)
    except RecursionError:  # the scan is exact for valid JSON; this is the backstop
        raise JsonLimitError(f"nested deeper than {max_depth} levels") from None


@functools.lru_cache(maxsize=4)
def _bounded_decoder(limit: float) -> json.JSONDecoder:
    def number(value: float | int) -> float | int | None:
        return value if -limit <= value <= limit else None  # NaN compares False

    return json.JSONDecoder(
        parse_float=lambda s: number(float(s)),
        parse_int=lambda s: number(int(s)),
        parse_constant=lambda _name: None,
    )


def read_json(
    path: str | os.PathLike[str] | bytes,
    max_bytes: int = MAX_DOCUMENT_BYTES,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """:func:`read_limited` then :func:`loads`; see their errors."""
    return loads(read_limited(path, max_bytes), max_depth)


def describe(exc: BaseException) -> str:
    """What is wrong, for a one-line message: ``not valid JSON (line 3, column 7: ...)``."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start : exc.start + 1]
        return f"not UTF-8 text (byte 0x{bad.hex() or '??'} at offset {exc.start})"
    if isinstance(exc, JsonLimitError):
        return str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, ValueError):
        return f"not valid JSON ({' '.join(str(exc).split())})"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
