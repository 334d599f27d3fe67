"""Reading the evidence's text: cleaned lines, the exit signal, tracebacks and
frames, and the small formatting helpers every matcher shares."""

from __future__ import annotations

from collections.abc import Sequence

from trainmedic.ostext import signal_name
from trainmedic.resilience.classify.model import MAX_LINE_CHARS
from trainmedic.resilience.classify.patterns import (
    ANSI_RE,
    EXC_LINE_RE,
    FRAME_RE,
    PREFIX_RE,
    TORCHRUN_EXIT_RE,
    TRACEBACK_START,
)
from trainmedic.resilience.errorfile import ErrorReport, is_user_code


def clean(line: str) -> str:
    """``line`` without ANSI colours, launcher prefixes (``[rank3]:``) and trailing space."""
    return PREFIX_RE.sub("", ANSI_RE.sub("", line)).rstrip()


def exit_signal(exit_code: int | None, lines: Sequence[str]) -> tuple[int | None, str]:
    """The signal that ended the job (or its failing worker) and where that came from."""
    if exit_code is not None and exit_code < 0:
        return -exit_code, "exit status"
    for line in lines:  # torchrun's summary names the worker's exit code
        m = TORCHRUN_EXIT_RE.search(line)
        if m and int(m[1]) < 0:
            return -int(m[1]), "torchrun summary"
    if exit_code is not None and 128 < exit_code <= 128 + 64:
        return exit_code - 128, "exit status 128+N"
    return None, ""


def signal_phrase(signum: int | None, source: str) -> str:
    if signum is None:
        return "the job failed"
    return f"the job was ended by {signal_name(signum)} ({source})"


def root_report(reports: Sequence[ErrorReport]) -> ErrorReport | None:
    """The earliest report: later ones are usually other ranks reacting to it."""
    return min(reports, key=lambda r: r.t) if reports else None


def tail(lines: Sequence[str], n: int) -> list[str]:
    return [line for line in lines if line.strip()][-n:]


def context(lines: Sequence[str], index: int, after: int = 2) -> list[str]:
    return list(lines[index : index + 1 + after])


def root_traceback(lines: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """The first traceback whose exception is not a launcher's wrapper (ChildFailedError)."""
    blocks: list[tuple[str, str, list[str]]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != TRACEBACK_START:
            i += 1
            continue
        frames: list[str] = []
        i += 1
        while i < len(lines):
            # The exception line is the first unindented line after the frames.
            if lines[i] and not lines[i][0].isspace():
                m = EXC_LINE_RE.match(lines[i])
                exc_type, message = (m[1], m[2] or "") if m else ("Exception", lines[i])
                blocks.append((exc_type, message, frames))
                break
            frames.append(lines[i])
            i += 1
        i += 1
    for block in blocks:
        if not block[0].endswith("ChildFailedError"):
            return block
    return None


def last_frame(lines: Sequence[str]) -> str | None:
    """The innermost frame among ``lines`` as ``file:N in f``, preferring the user's code."""
    frames = [m for line in lines if (m := FRAME_RE.match(line))]
    if not frames:
        return None
    user = [m for m in frames if is_user_code(m[1])]
    m = (user or frames)[-1]
    return f"{m[1]}:{m[2]} in {m[3]}"


def first_line(text: str) -> str:
    return text.strip().splitlines()[0][:MAX_LINE_CHARS] if text.strip() else ""


def human(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} bytes" if unit == "bytes" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
