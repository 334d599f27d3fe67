"""Every process the job ran, as the host sampler saw it: what the probe's reach is judged by.

A Python process of the job should carry the probe; when one runs for a
while and its probe never says hello, the diagnosis must say so (a launch
script replaced ``PYTHONPATH`` for an interpreter without trainmedic's
start-up hook, cleared the environment, or ran Python with ``-S``). The
census remembers each process of the job's tree once: its command, how long
it was seen, its CPU, and — for Python processes, read once from
``/proc/<pid>/environ`` — whether the supervisor's variables reached it and
what its ``PYTHONPATH`` was. At the end of an attempt it becomes one
``process_census`` event (:meth:`ProcessCensus.event`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.host import ps
from trainmedic.probe import BOOTSTRAP_DIR
from trainmedic.probe import env as probe_env
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent

MAX_PROCESSES = 2000
"""Processes remembered; beyond, the shortest-lived non-Python ones are forgotten."""
MAX_REPORTED = 40
"""Processes listed in the event: every Python process first, then the busiest others."""
MAX_ARG_CHARS = 200
MAX_ARGS = 8
_PYTHON = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?[a-z]?(?:\.exe)?$")
_PYTHON_FLAGS = frozenset({"-S", "-I", "-E", "-s"})


def is_python(name: str, exe: str | None, argv0: str | None) -> bool:
    """Whether a process runs a Python interpreter (by its executable, else its name)."""
    for candidate in (exe, argv0, name):
        if candidate and _PYTHON.match(os.path.basename(candidate)):
            return True
    return False


@dataclass
class SeenProcess:
    """One process of the job as the census saw it (times are Unix seconds).

    Attributes:
        probe_env: the supervisor's probe variables were in its environment
            (``None``: not read, e.g. not Python or not permitted).
        pythonpath: its ``PYTHONPATH`` (cut to :data:`MAX_ARG_CHARS`).
        bootstrap_on_path: that ``PYTHONPATH`` still held the probe's bootstrap.
        flags: interpreter flags that skip start-up files (``-S``, ``-I``, ``-E``, ``-s``).
    """

    pid: int
    created: float
    name: str
    exe: str | None
    argv: tuple[str, ...]
    python: bool
    first_seen: float
    last_seen: float
    cpu_s: float = 0.0
    probe_env: bool | None = None
    pythonpath: str | None = None
    bootstrap_on_path: bool | None = None
    flags: tuple[str, ...] = ()

    @property
    def lived_s(self) -> float:
        """Seconds from its start (or the run's) to the last reading that saw it."""
        return max(0.0, self.last_seen - self.created)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pid": self.pid,
            "name": self.name,
            "exe": self.exe,
            "argv": list(self.argv),
            "python": self.python,
            "lived_s": round(self.lived_s, 1),
            "cpu_s": round(self.cpu_s, 2),
        }
        if self.python:
            out.update(
                probe_env=self.probe_env,
                pythonpath=self.pythonpath,
                bootstrap_on_path=self.bootstrap_on_path,
                flags=list(self.flags),
            )
        return out


@dataclass
class ProcessCensus:
    """Processes of the job's tree by (pid, creation time)."""

    started_at: float
    seen: dict[tuple[int, float], SeenProcess] = field(default_factory=dict)

    def observe(self, p: ps.Process, key: tuple[int, float], cpu_s: float, now: float) -> None:
        """Note that ``p`` (inside its ``oneshot``) was alive at ``now`` with ``cpu_s`` used."""
        known = self.seen.get(key)
        if known is None:
            known = self._describe(p, key, now)
            if known is None:
                return
            self._make_room()
            self.seen[key] = known
        known.last_seen = now
        known.cpu_s = cpu_s

    def _describe(
        self, p: ps.Process, key: tuple[int, float], now: float
    ) -> SeenProcess | None:
        try:
            name = p.name()
        except ps.Error:
            return None
        exe: str | None
        try:
            exe = p.exe() or None
        except (ps.Error, OSError):
            exe = None
        try:
            argv = tuple(a[:MAX_ARG_CHARS] for a in p.cmdline()[:MAX_ARGS])
        except (ps.Error, OSError):
            argv = ()
        python = is_python(name, exe, argv[0] if argv else None)
        seen = SeenProcess(
            pid=key[0],
            created=max(key[1], self.started_at),
            name=name,
            exe=exe,
            argv=argv,
            python=python,
            first_seen=now,
            last_seen=now,
        )
        if python:
            seen.flags = _startup_flags(argv)
            try:
                environ = p.environ()
            except (ps.Error, OSError):
                return seen
            _note_environment(seen, environ)
        return seen

    def _make_room(self) -> None:
        if len(self.seen) < MAX_PROCESSES:
            return
        others = sorted(
            (k for k, v in self.seen.items() if not v.python), key=lambda k: self.seen[k].lived_s
        )
        for k in others[: max(1, len(self.seen) - MAX_PROCESSES + 1)]:
            del self.seen[k]

    def event(self, t: float, probe: bool) -> RunEvent:
        """The census as a ``process_census`` event (``data``: ``probe``, ``processes``,
        ``processes_total``)."""
        entries = sorted(
            self.seen.values(), key=lambda s: (not s.python, -s.lived_s, -s.cpu_s, s.pid)
        )
        python = sum(1 for s in entries if s.python)
        return RunEvent(
            t=t,
            kind=EventKind.PROCESS_CENSUS,
            message=f"{len(entries)} processes seen in the job ({python} Python)",
            data={
                "probe": probe,
                "processes_total": len(entries),
                "processes": [s.to_dict() for s in entries[:MAX_REPORTED]],
            },
        )


def _startup_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """Interpreter flags before the script or ``-c``/``-m`` that skip start-up files."""
    flags: list[str] = []
    for arg in argv[1:]:
        if not arg.startswith("-") or arg in ("-c", "-m", "-"):
            break
        if arg.startswith("--"):
            continue
        # Single-letter options may be grouped: ``-uS``.
        for letter in arg[1:]:
            flag = f"-{letter}"
            if flag in _PYTHON_FLAGS and flag not in flags:
                flags.append(flag)
            if letter in "cmWX":
                break
    return tuple(flags)


def _note_environment(seen: SeenProcess, environ: Mapping[str, str]) -> None:
    seen.probe_env = bool(environ.get(probe_env.ADDR))
    path = environ.get("PYTHONPATH")
    seen.pythonpath = None if path is None else path[:MAX_ARG_CHARS]
    entries = [os.path.normpath(e) for e in (path or "").split(os.pathsep) if e]
    seen.bootstrap_on_path = os.path.normpath(BOOTSTRAP_DIR) in entries
