"""Where exported reports go: never over a file trainmedic did not write for that purpose.

``--json FILE``, ``--html FILE`` and ``--trace FILE`` are checked, all of
them, before any work (:func:`check_outputs`); the rules, in order:

* the path must be possible (no name over 255 bytes), its directory must
  exist, and it must not be a directory or a socket;
* symbolic links are followed: the rules apply to the file they lead to;
* inside the run directory the report is about, only a new file directly in
  it, or trainmedic's own earlier export of the same kind, may be written —
  never a file of the record (``steps.jsonl``, ``findings.json``, the logs,
  ...) and nothing in its subdirectories (checkpoints, attempts); no flag
  overrides this;
* elsewhere, an existing file is replaced only when it is trainmedic's own
  export of the same kind (a findings document, an HTML report, a trace)
  or with ``--force``;
* an existing character device or FIFO (``/dev/null``, a named pipe) is
  written into, never replaced.

:func:`write_output` writes through a temporary file in the same directory
and renames it into place, so a failure never leaves half a file where an
earlier one was.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trainmedic import jsonfile
from trainmedic.atomicfile import atomic_writer
from trainmedic.errors import InputError, UsageError
from trainmedic.jsonfile import FIFO_WAIT_S
from trainmedic.ostext import path_problem, printable

HTML_MARK = b'<meta name="generator" content="trainmedic">'
TRACE_MARKS = (b'"generator":"trainmedic"', b'{"displayTimeUnit":"ms","traceEvents":[')
_SNIFF_BYTES = 4096


@dataclass(frozen=True)
class Output:
    """One checked output.

    Attributes:
        flag: ``--json``, ``--html`` or ``--trace``.
        path: the path as given (for messages).
        target: where the bytes go (symbolic links followed).
        stream: an existing device or FIFO: written into, not replaced.
    """

    flag: str
    path: Path
    target: Path
    stream: bool = False


def record_names() -> frozenset[str]:
    """The names of a run directory's own files, never written by an export."""
    from trainmedic.probe import env as probe_env
    from trainmedic.record.layout import FINDINGS_FILE, LINE_FILES, META_FILE

    return frozenset(
        {
            *LINE_FILES,
            META_FILE,
            FINDINGS_FILE,
            "stdout.log",
            "stderr.log",
            "output.log",
            "probe.sock",
            probe_env.BOOTSTRAP_ERRORS,
        }
    )


def check_outputs(
    requested: Mapping[str, str | None],
    *,
    run_dir: Path | None = None,
    force: bool = False,
    can_force: bool = True,
) -> dict[str, Output]:
    """The outputs to write, checked by the rules in the module docstring.

    ``None`` and ``--json``'s ``"-"`` (stdout) are left out; ``"-"`` for another flag
    is refused (only the findings document goes to standard output). ``can_force``:
    the command has ``--force`` (a refusal names it only then).

    Raises:
        UsageError / InputError: one line naming the flag and the problem (exit 2).
    """
    outputs: dict[str, Output] = {}
    seen: dict[Path, str] = {}
    run_root = _resolved_dir(run_dir)
    for flag, value in requested.items():
        if value is None or (value == "-" and flag == "--json"):
            continue
        if value == "-":
            raise UsageError(f"{flag} -: only --json writes to standard output; give {flag} a "
                             "file name")  # fmt: skip
        output = _check_one(flag, value, run_root, force, can_force)
        if output.target in seen and not output.stream:
            raise UsageError(
                f"{flag} and {seen[output.target]} name the same file {printable(value)}"
            )
        seen[output.target] = flag
        outputs[flag] = output
    return outputs


def _resolved_dir(run_dir: Path | None) -> Path | None:
    if run_dir is None:
        return None
    try:
        return run_dir.resolve() if run_dir.is_dir() else None
    except OSError:
        return None


def _check_one(
    flag: str, value: str, run_root: Path | None, force: bool, can_force: bool = True
) -> Output:
    shown = printable(value)
    if not value:
        raise UsageError(f"{flag}: empty file name")
    problem = path_problem(value)
    if problem:
        raise InputError(f"{flag} {shown}: {problem}")
    path = Path(value)
    try:
        target = path.resolve()
        st: os.stat_result | None = target.stat()
    except FileNotFoundError:
        st = None
    except RuntimeError:  # a symlink loop (Python < 3.13)
        raise InputError(f"{flag} {shown}: too many levels of symbolic links") from None
    except OSError as exc:
        raise InputError(f"{flag} {shown}: {exc.strerror or exc}") from None
    if st is None:
        if not _is_dir(target.parent):
            folder = printable(str(path.parent))
            raise InputError(f"{flag} {shown}: directory {folder} does not exist")
    elif stat.S_ISDIR(st.st_mode):
        raise InputError(f"{flag} {shown}: is a directory")
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return Output(flag, path, target, stream=True)
    elif not stat.S_ISREG(st.st_mode):
        raise InputError(f"{flag} {shown}: is not a regular file")
    if run_root is not None and (target == run_root or run_root in target.parents):
        _check_inside_run(flag, shown, target, run_root, exists=st is not None)
    elif st is not None and not force and not is_own_output(flag, target):
        raise InputError(
            f"{flag} {shown}: exists and is not a trainmedic {_KIND[flag]} "
            + ("(use --force to replace it)" if can_force else "(choose another file name)")
        )
    return Output(flag, path, target)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _check_inside_run(flag: str, shown: str, target: Path, run_root: Path, exists: bool) -> None:
    if target.parent != run_root:
        where = target.relative_to(run_root).parts[0]
        raise InputError(
            f"{flag} {shown}: is inside the run directory's {where}/ "
            "(trainmedic never writes over a run directory's files; choose a path outside it)"
        )
    if target.name in record_names():
        raise InputError(
            f"{flag} {shown}: would overwrite the run record's {target.name} "
            "(trainmedic never writes over a run directory's files)"
        )
    if exists and not is_own_output(flag, target):
        raise InputError(
            f"{flag} {shown}: is a file of the run directory, not a trainmedic "
            f"{_KIND[flag]} (trainmedic never writes over a run directory's files)"
        )


_KIND = {"--json": "JSON output", "--html": "HTML report", "--trace": "trace"}


def is_own_output(flag: str, path: Path) -> bool:
    """Whether ``path`` holds trainmedic's own export of the kind ``flag`` writes."""
    try:
        if flag == "--json":
            data = jsonfile.read_json(path, max_bytes=64 * 1024 * 1024)
            # Every JSON export of trainmedic (findings documents, tuning results)
            # names its tool and schema version.
            return isinstance(data, dict) and {"schema_version", "tool"} <= set(data)
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except (OSError, ValueError):
        return False
    if flag == "--html":
        return HTML_MARK in head
    if flag == "--trace":
        return any(mark in head for mark in TRACE_MARKS)
    return False


def write_output(output: Output, produce: Callable[[IO[str]], object]) -> None:
    """Write what ``produce`` writes into the file object it gets to ``output``.

    A regular file is written to a temporary file next to it (mode 0600, or
    the mode of the file it replaces) and renamed into place.

    Raises:
        InputError: the file cannot be written (one line).
    """
    try:
        if output.stream:
            fd = _open_stream(output.target)
            with open(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
                produce(f)
            return
        _replace(output.target, produce)
    except OSError as exc:
        raise InputError(
            f"{output.flag} {printable(str(output.path))}: cannot write: {exc.strerror or exc}"
        ) from None


def _open_stream(target: Path, wait_s: float = FIFO_WAIT_S) -> int:
    """Open a device or FIFO for writing; a FIFO nobody reads fails after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: a FIFO without a reader yet
                raise
            if time.monotonic() >= deadline:
                raise OSError(
                    errno.ENXIO, f"nothing read from the FIFO within {wait_s:g} s"
                ) from None
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def _replace(target: Path, produce: Callable[[IO[str]], object]) -> None:
    # A file being replaced keeps its permissions (the user's own export target).
    with atomic_writer(target, keep_mode=True) as f:
        produce(f)
