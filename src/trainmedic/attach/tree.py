"""The processes of a job already running, found from one PID and named by what they are.

The PID a user knows is often not the training process: it is torchrun's
agent, ``accelerate launch``, a shell script or ``srun``'s step. The job is
that process and its descendants; each is named from what ``/proc`` shows:

* ``training``: a Python process with torch loaded (``libtorch`` in its
  memory maps) whose parent is not one - a rank, with ``RANK`` from its
  environment when it is distributed;
* ``worker``: a Python process with torch whose parent is a training process
  (DataLoader workers, forked or spawned, and the job's own ``multiprocessing``);
* ``launcher``: a process above a training process (torchrun's agent, a shell);
* ``python``: another Python process (a sidecar, a data server of the job's);
* ``other``: anything else.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from trainmedic.errors import InputError
from trainmedic.host import ps
from trainmedic.supervise.observe.census import is_python

ROLES = ("training", "worker", "launcher", "python", "other")
MAX_PROCESSES = 512
"""Processes followed below the PID given: a job with more is cut, and says so."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _escaped(m: re.Match[str]) -> str:
    return {"\n": "\\n", "\t": "\\t"}.get(m[0], f"\\x{ord(m[0]):02x}")


@dataclass(frozen=True)
class JobProcess:
    """One process of the attached job.

    Attributes:
        role: one of :data:`ROLES` (module docstring).
        argv: its command line (empty when unreadable).
        rank: ``RANK`` from its environment (``None``: not set or not readable).
        torch: torch is loaded in it (``None``: its memory maps cannot be read).
    """

    pid: int
    ppid: int
    role: str
    argv: tuple[str, ...]
    python: bool
    torch: bool | None
    rank: int | None = None

    def describe(self) -> str:
        """``rank 0 (pid 123, python train.py)``."""
        what = {
            "training": "training process",
            "worker": "worker",
            "launcher": "launcher",
            "python": "Python process",
            "other": "process",
        }[self.role]
        if self.role == "training" and self.rank is not None:
            what = f"rank {self.rank}"
        # One line whatever the arguments hold (``python -c`` code has newlines).
        command = _CONTROL.sub(_escaped, " ".join(self.argv[:4]))[:80] or "?"
        return f"{what} (pid {self.pid}, {command})"


@dataclass(frozen=True)
class JobTree:
    """The attached PID and every process below it, parents before children."""

    root: int
    processes: tuple[JobProcess, ...]
    cut: int = 0
    """Descendants beyond :data:`MAX_PROCESSES`, left out."""

    def by_role(self, role: str) -> list[JobProcess]:
        return [p for p in self.processes if p.role == role]

    def get(self, pid: int) -> JobProcess | None:
        return next((p for p in self.processes if p.pid == pid), None)


def find_job(pid: int, proc: str = "/proc") -> JobTree:
    """The job at ``pid`` and below.

    Raises:
        InputError: no such process, or it is this process or one above it.
    """
    if pid <= 0:
        raise InputError(f"{pid} is not a process id")
    try:
        top = ps.Process(pid)
        below = top.children(recursive=True)
    except ps.NoSuchProcess:
        raise InputError(f"no process {pid} is running") from None
    except ps.AccessDenied:
        below = []
    if pid == os.getpid() or pid in {p.pid for p in ps.Process().parents()}:
        raise InputError(f"process {pid} is trainmedic itself or a shell above it, not a job")
    cut = max(0, len(below) - MAX_PROCESSES)
    found = [top, *below[:MAX_PROCESSES]]
    facts: dict[int, tuple[int, tuple[str, ...], bool, bool | None, int | None]] = {}
    for p in found:
        try:
            with p.oneshot():
                ppid = p.ppid()
                argv = tuple(_safe(p.cmdline))
                name = p.name()
                exe = _safe_str(p.exe)
        except ps.NoSuchProcess:
            continue  # ended while being read
        except ps.AccessDenied:
            ppid, argv, name, exe = p.ppid(), (), "", None
        python = is_python(name, exe, argv[0] if argv else None)
        torch = _has_torch(p.pid, proc) if python else False
        facts[p.pid] = (ppid, argv, python, torch, _rank(p) if python else None)
    roles = _roles(pid, facts)
    processes = tuple(
        JobProcess(p, f[0], roles[p], f[1], f[2], f[3], f[4]) for p, f in facts.items()
    )
    return JobTree(pid, processes, cut)


def _roles(
    root: int, facts: dict[int, tuple[int, tuple[str, ...], bool, bool | None, int | None]]
) -> dict[int, str]:
    roles: dict[int, str] = {}
    for pid, (ppid, argv, python, torch, rank) in facts.items():  # parents come first
        parent = roles.get(ppid) if pid != root else None
        if python and parent in ("training", "worker"):
            # A rank under a launcher that is itself a torch process (torchrun's agent):
            # the agent was taken for training until its ranks showed.
            if rank is not None and facts[ppid][4] is None:
                roles[ppid] = "launcher"
                roles[pid] = "training"
            else:
                roles[pid] = "worker"
        elif python and torch is not False and not _launcher(argv):
            roles[pid] = "training"
        elif python:
            roles[pid] = "python"
        else:
            roles[pid] = "other"
    # Launchers: processes above a training process.
    for pid, role in list(roles.items()):
        if role != "training":
            continue
        up = facts[pid][0]
        while up in roles and roles[up] in ("other", "python", "launcher"):
            roles[up] = "launcher"
            up = facts[up][0]
    return roles


_LAUNCHERS = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "torchrun",
    "accelerate",
    "deepspeed",
    "torch.distributed.elastic",
)


def _launcher(argv: tuple[str, ...]) -> bool:
    """A command that starts ranks rather than trains (its torch is loaded to do so)."""
    head = argv[:4]
    return any(os.path.basename(a) in _LAUNCHERS or a in _LAUNCHERS for a in head)


def _has_torch(pid: int, proc: str) -> bool | None:
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
            for line in f:
                if b"libtorch" in line:
                    return True
    except OSError:
        return None
    return False


def _rank(p: ps.Process) -> int | None:
    try:
        value = p.environ().get("RANK")
    except (ps.Error, OSError):
        return None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _safe(read: object) -> list[str]:
    try:
        got = read()  # type: ignore[operator]
    except ps.AccessDenied:
        return []
    return [str(a) for a in got]


def _safe_str(read: object) -> str | None:
    try:
        got = read()  # type: ignore[operator]
    except (ps.AccessDenied, OSError):
        return None
    return str(got) if got else None
