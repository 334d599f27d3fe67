"""Reading a run directory back into a :class:`~trainmedic.record.types.RunRecord`.

:func:`load_run_record` is bounded (sizes, line lengths, nesting and numbers,
through :mod:`trainmedic.jsonfile`) and strict: a cut last line (a writer that
crashed while appending) is skipped, any other malformed line is an error
naming the file and line. docs/run-record.md describes the files.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

from trainmedic import jsonfile
from trainmedic.errors import RunDirectoryError
from trainmedic.ostext import printable
from trainmedic.record import codec
from trainmedic.record.layout import (
    EVENTS_FILE,
    GPU_FILE,
    HOST_FILE,
    LOADER_ACTIVITY_FILE,
    LOADERS_FILE,
    META_FILE,
    STEPS_FILE,
    WINDOWS_FILE,
)
from trainmedic.record.types import RunRecord

MAX_META_BYTES = 16 * 1024 * 1024
"""Largest meta.json read back, bytes (trainmedic writes a few KiB)."""
MAX_RECORD_FILE_BYTES = 4 * 1024**3
"""Largest JSON-lines file of a record read back, bytes (the writer's caps keep
a month-long run far below)."""

T = TypeVar("T")


def load_run_record(run_dir: Path) -> RunRecord:
    """Read a run directory written by :class:`RunRecordWriter`.

    Steps and windows come back in time order (``t``); other records in the
    order they were written. A last line cut short (the writer crashed while
    appending) is skipped; any other malformed line is an error.

    Raises:
        RunDirectoryError: the directory is missing or not a run directory, or
            meta.json or a line is malformed (the message names file and line).
    """
    run_dir = Path(run_dir)
    shown = printable(str(run_dir))
    try:
        st = run_dir.stat()
    except FileNotFoundError:
        raise RunDirectoryError(f"run directory {shown} does not exist") from None
    except OSError as exc:
        raise RunDirectoryError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirectoryError(f"{shown} is not a directory")
    meta_path = run_dir / META_FILE
    try:
        meta_st = meta_path.stat()
    except FileNotFoundError:
        raise RunDirectoryError(f"{shown} is not a run directory (no {META_FILE})") from None
    except OSError as exc:
        raise RunDirectoryError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(meta_st.st_mode):
        raise RunDirectoryError(f"{shown} is not a run directory ({META_FILE} is a directory)")
    try:
        raw = jsonfile.read_limited(meta_path, MAX_META_BYTES)
        meta_obj = jsonfile.loads(raw, max_number=jsonfile.MAX_RECORD_NUMBER)
        meta = codec.decode_meta(_object(meta_obj))
    except OSError as exc:
        raise RunDirectoryError(f"cannot read {meta_path}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise RunDirectoryError(f"{meta_path}: malformed run metadata: {_reason(exc)}") from exc

    gpu_decoder = codec.GpuSampleDecoder()
    record = RunRecord(
        meta=meta,
        steps=_read_lines(run_dir / STEPS_FILE, codec.decode_step),
        windows=_read_lines(run_dir / WINDOWS_FILE, codec.decode_window),
        loaders=_read_lines(run_dir / LOADERS_FILE, codec.decode_loader),
        loader_activity=_read_lines(run_dir / LOADER_ACTIVITY_FILE, codec.decode_loader_activity),
        gpu=_read_lines(run_dir / GPU_FILE, gpu_decoder.decode),
        host=_read_lines(run_dir / HOST_FILE, codec.decode_host),
        events=_read_lines(run_dir / EVENTS_FILE, codec.decode_event),
    )
    record.steps.sort(key=lambda s: s.t)
    record.windows.sort(key=lambda w: w.t)
    return record


def _read_lines(path: Path, decode: Callable[[Mapping[str, Any]], T]) -> list[T]:
    """Decode every line of a JSON-lines file; a missing file reads as empty.

    A file over :data:`MAX_RECORD_FILE_BYTES` or a line over
    :data:`~trainmedic.jsonfile.MAX_LINE_BYTES` is refused (whatever sits in
    the directory under a record's name, ``/dev/zero`` included).
    """
    out: list[T] = []
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return out
    except OSError as exc:
        raise RunDirectoryError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_RECORD_FILE_BYTES:
                raise RunDirectoryError(
                    f"{path}: larger than {jsonfile.size_text(MAX_RECORD_FILE_BYTES)} "
                    f"({jsonfile.size_text(size)}); not a record trainmedic wrote"
                )
            for number, raw, is_last in _numbered_lines(f):
                if not raw.strip():
                    continue
                try:
                    obj = jsonfile.loads(raw, max_number=jsonfile.MAX_RECORD_NUMBER)
                    out.append(decode(_object(obj)))
                except (ValueError, KeyError, TypeError) as exc:
                    if is_last and not raw.endswith(b"\n"):
                        # A crash while appending leaves the last line cut short.
                        break
                    raise RunDirectoryError(
                        f"{path}:{number}: malformed record: {_reason(exc)}"
                    ) from exc
        except OSError as exc:
            raise RunDirectoryError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return out


def _numbered_lines(f: IO[bytes]) -> Iterator[tuple[int, bytes, bool]]:
    """(1-based number, line, whether it is the last line) for each line of ``f``.

    Raises:
        RunDirectoryError: a line is longer than ``MAX_LINE_BYTES``, or the
            file (a pipe or device under a record's name) yields more than
            ``MAX_RECORD_FILE_BYTES``.
    """
    limit = jsonfile.MAX_LINE_BYTES
    number = 0
    total = 0
    previous: bytes | None = None
    while True:
        line = f.readline(limit + 1)
        if not line:
            break
        total += len(line)
        if len(line) > limit or total > MAX_RECORD_FILE_BYTES:
            what = f"line {number + 1} is longer than {jsonfile.size_text(limit)}"
            if len(line) <= limit:
                what = f"more than {jsonfile.size_text(MAX_RECORD_FILE_BYTES)}"
            raise RunDirectoryError(f"{f.name!s}: {what}; not a record trainmedic wrote")
        if previous is not None:
            yield number, previous, False
        number += 1
        previous = line
    if previous is not None:
        yield number, previous, True


def _object(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _reason(exc: BaseException) -> str:
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError, jsonfile.JsonLimitError)):
        return jsonfile.describe(exc)
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return " ".join(str(exc).split())
