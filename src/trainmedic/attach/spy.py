"""Every thread's Python stack, sampled from outside with py-spy, without stopping the job.

``py-spy record --nonblocking`` reads each interpreter's memory at a fixed
rate without pausing it (the samples can be torn now and then, never the
job); ``--idle`` keeps the samples of threads that wait (a wait is what is
looked for), ``--subprocesses`` follows every process below the PID,
``--threads`` and ``--full-filenames`` say which thread and which file. Its
``raw`` output is one line per distinct stack and thread with its count::

    process 123:"python t.py";thread (123): MainThread;<module> (/t.py:40);get (/t.py:12) 72

frames outermost first. :func:`parse_raw` reads it into :class:`ThreadSamples`.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.host.reaped import run_measured
from trainmedic.supervise.hang.forensics import find_py_spy

DEFAULT_RATE = 50
"""Samples a second per thread: 1,500 in the default 30 s, a share known to ±2.5 %."""
_LINE = re.compile(r'^((?:process \d+:".*?";)+)thread \((\d+)\)(?:: ([^;]*))?;?(.*) (\d+)$')
_PROCESS = re.compile(r'process (\d+):"(.*?)";(?=process \d+:"|$)')
"""One process of a line's chain: with ``--subprocesses`` py-spy names a child's samples
``process PARENT:"...";process CHILD:"...";thread (...)``, the sampled process last."""
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")
_SUMMARY = re.compile(r"Samples: (\d+) Errors: (\d+)")


@dataclass(frozen=True)
class Frame:
    """One Python frame: its function, file (full path) and line."""

    function: str
    file: str
    line: int | None = None

    def where(self) -> str:
        """``train.py:12 fetch``."""
        name = self.file.rsplit("/", 1)[-1]
        return f"{name}:{self.line} {self.function}" if self.line else f"{name} {self.function}"


Stack = tuple[Frame, ...]
"""Frames innermost first."""


@dataclass
class ThreadSamples:
    """The samples of one thread over the window."""

    pid: int
    tid: int
    name: str
    stacks: dict[Stack, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.stacks.values())

    def top(self) -> tuple[Stack, int]:
        """The stack seen most often and its count."""
        return max(self.stacks.items(), key=lambda kv: kv[1])


@dataclass(frozen=True)
class Sampling:
    """What py-spy recorded.

    Attributes:
        threads: by ``(pid, tid)``.
        commands: each process's command line, as py-spy read it.
        samples / errors: py-spy's own counts (``None``: it said nothing).
        problem: why it recorded nothing, one line (``None``: it did).
        sampler_cpu_s: CPU seconds py-spy itself used (user + system, from the kernel's
            accounting of the child; ``None``: not run): the most it can have taken from
            the job's threads.
    """

    threads: dict[tuple[int, int], ThreadSamples]
    commands: dict[int, str]
    seconds: float
    rate: int
    samples: int | None = None
    errors: int | None = None
    problem: str | None = None
    sampler_cpu_s: float | None = None


def dump_native(pid: int, timeout_s: float = 30.0) -> tuple[str | None, str | None]:
    """Every thread's stack of ``pid``, native frames with Python's (``py-spy dump
    --native``): ``(text, None)``, or ``(None, why not)``. Reading native frames pauses
    the process for a few milliseconds (py-spy cannot unwind them without), so it is
    done only when asked, or for a job that is stuck."""
    py_spy = find_py_spy()
    if py_spy is None:
        return None, "py-spy is not installed"
    try:
        done = subprocess.run(
            [py_spy, "dump", "--native", "--pid", str(pid)],
            capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"py-spy dump failed: {type(exc).__name__}"
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[-200:]
        return None, f"py-spy dump exited {done.returncode}: {said or 'no message'}"
    return done.stdout, None


def parse_raw(text: str) -> tuple[dict[tuple[int, int], ThreadSamples], dict[int, str]]:
    """The threads' samples and the processes' commands in py-spy's ``raw`` output."""
    threads: dict[tuple[int, int], ThreadSamples] = {}
    commands: dict[int, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        chain = _PROCESS.findall(m[1])
        if not chain:
            continue
        pid, tid, count = int(chain[-1][0]), int(m[2]), int(m[5])
        commands[pid] = chain[-1][1]
        frames: list[Frame] = []
        for part in m[4].split(";") if m[4] else ():
            f = _FRAME.match(part)
            if f:
                frames.append(Frame(f[1], f[2], int(f[3]) if f[3] else None))
            elif part:
                frames.append(Frame(part, ""))
        stack = tuple(reversed(frames))
        key = (pid, tid)
        thread = threads.setdefault(key, ThreadSamples(pid, tid, (m[3] or "").strip()))
        thread.stacks[stack] = thread.stacks.get(stack, 0) + count
    return threads, commands


def record(pid: int, seconds: int, out: Path, rate: int = DEFAULT_RATE) -> Sampling:
    """Sample every thread below ``pid`` for ``seconds`` (py-spy writes to ``out``)."""
    py_spy = find_py_spy()
    if py_spy is None:
        return Sampling(
            {},
            {},
            seconds,
            rate,
            problem=("py-spy is not installed beside trainmedic nor on PATH: pip install py-spy"),
        )
    argv = [
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--nonblocking",
        "--idle",
        "--threads",
        "--subprocesses",
        "--full-filenames",
        "--format",
        "raw",
        "--rate",
        str(rate),
        "--duration",
        str(seconds),
        "--output",
        str(out),
    ]
    ran = run_measured(argv, out.with_suffix(".log"), seconds + 60)
    if ran is None:
        return Sampling({}, {}, seconds, rate, problem="py-spy did not finish in time")
    code, said, cpu_s = ran
    summary = _SUMMARY.search(said)
    try:
        text = out.read_text(errors="replace")
    except OSError:
        text = ""
    threads, commands = parse_raw(text)
    problem = None
    if not threads:
        tail = " ".join(said.split())[-300:]
        problem = f"py-spy recorded no sample (exit {code}): {tail or 'no message'}"
    return Sampling(
        threads,
        commands,
        seconds,
        rate,
        samples=int(summary[1]) if summary else None,
        errors=int(summary[2]) if summary else None,
        problem=problem,
        sampler_cpu_s=cpu_s,
    )
