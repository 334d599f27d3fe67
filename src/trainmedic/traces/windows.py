"""The traces of a run's profiler windows, read back for its diagnosis.

The probe writes one trace per window and process to the run directory's
:data:`~trainmedic.record.layout.PROFILES_DIR` (:mod:`trainmedic.probe.profile_window`),
named ``pid<PID>[-rank<R>]-step<N>.json.gz``: ``N`` is the step after which
the window opened, the same on every rank of a job that trains in lockstep, so
the traces of one window across ranks are found by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trainmedic.errors import InputError
from trainmedic.ostext import printable
from trainmedic.record.layout import PROFILES_DIR
from trainmedic.traces.kineto import TraceSummary, read_trace

MAX_TRACES = 64
"""Traces read from one run, the latest windows first: the rest are named as left out."""
MAX_TRACE_BYTES = 512 * 1024 * 1024
"""A window trace larger than this (compressed) is left out: a window is a few steps."""
_NAME = re.compile(r"^pid(\d+)(?:-rank(\d+))?-step(\d+)\.json\.gz$")


@dataclass(frozen=True)
class WindowTrace:
    """One window's trace of one process.

    Attributes:
        summary: what the trace says (:class:`~trainmedic.traces.kineto.TraceSummary`).
        pid: the process.
        after_step: the training step after which the window opened.
        file: the trace's file name in the profiles folder.
    """

    summary: TraceSummary
    pid: int
    after_step: int
    file: str


@dataclass(frozen=True)
class WindowTraces:
    """The window traces of a run and, one line each, those that could not be read."""

    traces: tuple[WindowTrace, ...] = ()
    problems: tuple[str, ...] = ()


def read_window_traces(run_dir: Path) -> WindowTraces:
    """The run's window traces; a missing folder is none, an unreadable trace a problem."""
    folder = run_dir / PROFILES_DIR
    try:
        names = [p for p in folder.iterdir() if _NAME.match(p.name)]
    except FileNotFoundError:
        return WindowTraces()
    except OSError as exc:
        return WindowTraces(problems=(f"{printable(str(folder))}: {exc.strerror}",))
    named = sorted(((int(m[3]), int(m[1]), p) for p in names if (m := _NAME.match(p.name))),
                   reverse=True)  # fmt: skip
    traces: list[WindowTrace] = []
    problems: list[str] = []
    for after, pid, path in named[:MAX_TRACES]:
        shown = printable(path.name)
        try:
            if path.is_symlink() or not path.is_file():
                problems.append(f"{shown}: not a regular file")
                continue
            size = path.stat().st_size
            if size > MAX_TRACE_BYTES:
                problems.append(f"{shown}: {size / 2**20:.0f} MiB, more than a window's trace")
                continue
            summary = read_trace(path)
        except InputError as exc:
            problems.append(str(exc))
            continue
        except OSError as exc:
            problems.append(f"{shown}: {exc.strerror}")
            continue
        traces.append(WindowTrace(summary, pid, after, path.name))
    if len(named) > MAX_TRACES:
        problems.append(f"{len(named) - MAX_TRACES} older window trace(s) left out")
    traces.sort(key=lambda w: (w.after_step, w.pid))
    return WindowTraces(tuple(traces), tuple(problems))
