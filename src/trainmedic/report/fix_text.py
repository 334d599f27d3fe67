"""Fixes with what trainmedic knows filled in, so that they can be pasted.

A rule writes its fix once for every run, with placeholders where the run's
own facts go: ``trainmedic run --apply-from RUN_DIR -- CMD``, ``py-spy dump
--pid PID``. The findings document keeps the fix as the rule wrote it (tools
read it); the terminal and the HTML report show it with this run's
directory and the user's own command line, each quoted as a POSIX shell reads
it (:func:`shlex.quote`), and the process id where the process is still
there to look at (``trainmedic attach``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmedic.ostext import printable


@dataclass(frozen=True)
class Known:
    """What a report knows that a fix's placeholders stand for.

    Attributes:
        run_dir: the run's directory (``RUN_DIR``).
        command: the job's command line (``CMD``).
        pid: a process that is still running (``PID``); ``None`` for a finished run,
            whose processes are gone.
        evidence_at: where the full evidence is: a file, or the command that prints it.
    """

    run_dir: Path | None = None
    command: Sequence[str] = ()
    pid: int | None = None
    evidence_at: str | None = None


_RUN_DIR = re.compile(r"\bRUN_DIR\b")
_COMMAND = re.compile(r"(?<=-- )CMD\b(?: \.\.\.)?")
_PID = re.compile(r"(?<=--pid )PID\b|(?<=attach )PID\b")


def fill(fix: str, known: Known | None) -> str:
    """``fix`` with the placeholders ``known`` can answer replaced; the others stay."""
    if known is None or not fix:
        return fix
    if known.run_dir is not None:
        directory = shlex.quote(printable(str(known.run_dir)))
        fix = _RUN_DIR.sub(lambda _: directory, fix)
    if known.command:
        command = shlex.join(printable(a) for a in known.command)
        fix = _COMMAND.sub(lambda _: command, fix)
    if known.pid is not None:
        pid = str(known.pid)
        fix = _PID.sub(lambda _: pid, fix)
    return fix
