"""Start the user's command as a child in its own session, and stop it and its kin.

The child runs in a new session (its own process group), so the terminal's
Ctrl-C reaches trainmedic only and trainmedic decides what the job gets
(:mod:`trainmedic.supervise.launch.signals`). A small process leads that session
(:mod:`trainmedic.supervise.launch.session_holder`) and the job is its child, so the
job may call ``setsid()`` itself, as it can when a script starts it. Its stdout and stderr are
pseudo-terminals when ours are terminals (so the job buffers, colours and draws progress bars as it
would without trainmedic) and pipes otherwise. When our stdout and stderr go
to the same place (one terminal, or ``> log 2>&1``), the job gets a single
channel for both, so their interleaving stays exactly as the job wrote it.
The probe reaches the job through its environment (:func:`probe_environment`).

trainmedic makes itself a child subreaper (Linux) so processes the job
leaves behind are re-parented to it and :meth:`Job.reap_leftovers` can stop
them: no orphan outlives ``trainmedic run``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import termios
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trainmedic
from trainmedic.errors import TrainmedicError
from trainmedic.host import ps
from trainmedic.ostext import printable
from trainmedic.probe import BOOTSTRAP_DIR
from trainmedic.probe import env as probe_env

_PR_SET_CHILD_SUBREAPER = 36


class CommandNotFoundError(TrainmedicError):
    """The command does not exist (exit 127, like a shell)."""

    exit_code = 127


class CommandNotExecutableError(TrainmedicError):
    """The command exists but cannot be executed (exit 126, like a shell)."""

    exit_code = 126


def exit_status(returncode: int) -> int:
    """A shell's ``$?`` for a child's return code: ``128 + signal`` when killed."""
    return 128 - returncode if returncode < 0 else returncode


def probe_environment(
    base: Mapping[str, str],
    address: str,
    token: str,
    run_dir: Path,
    probe: bool = True,
) -> dict[str, str]:
    """The job's environment: ``base`` plus what the probe needs.

    The variables make the start-up hook installed with trainmedic
    (``trainmedic-probe.pth``) load the probe in every interpreter of an
    environment that has it, whatever ``PYTHONPATH`` becomes; for other
    interpreters the bootstrap directory goes first on ``PYTHONPATH`` (an
    existing ``PYTHONPATH`` follows unchanged). docs/run.md, "Probe loading".
    What an earlier trainmedic left in ``base`` (a shell started inside a run
    whose supervisor is gone) is dropped first, so the job never reports to
    another run's socket: with ``probe=False`` the job gets no probe at all.
    """
    env = dict(base)
    for name in (probe_env.ADDR, probe_env.TOKEN):
        env.pop(name, None)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _is_bootstrap(p)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    if not probe:
        return env
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + existing if existing else "")
    env[probe_env.ADDR] = address
    env[probe_env.TOKEN] = token
    env[probe_env.HOME] = str(Path(trainmedic.__file__).resolve().parent.parent)
    env[probe_env.RUN_DIR] = str(run_dir.resolve())
    return env


def _is_bootstrap(entry: str) -> bool:
    """Whether a ``PYTHONPATH`` entry is a trainmedic probe bootstrap directory (any install)."""
    path = Path(entry)
    own = Path(BOOTSTRAP_DIR)
    return path == own or (
        path.name == own.name
        and path.parent.name == own.parent.name
        and (path / "sitecustomize.py").is_file()
    )


_NOT_THE_JOB: set[int] = set()

JOB_ENV = "TRAINMEDIC_JOB"
"""Set in the job's environment to a value unique to the job: its processes
inherit it, so one that re-parents to trainmedic is still known as the job's."""


def exclude_from_job(pid: int) -> None:
    """A child of trainmedic's own (the output keeper) that is never part of a job:
    not sampled, not stopped as a leftover."""
    _NOT_THE_JOB.add(pid)


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``); ``False`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def resolve_command(argv0: str, env: Mapping[str, str]) -> str:
    """The executable ``argv0`` names, as a shell would find it.

    Raises:
        CommandNotFoundError / CommandNotExecutableError (names over the
        filesystem's limits included: they exist nowhere).
    """
    shown = printable(argv0)
    if not argv0:
        raise CommandNotFoundError("command not found: '' (an empty command name)")
    try:
        if os.sep in argv0:
            path = Path(argv0)
            if not path.exists():
                raise CommandNotFoundError(f"command not found: {shown}")
            if path.is_dir() or not os.access(path, os.X_OK):
                raise CommandNotExecutableError(f"command not executable: {shown}")
            return argv0
        found = shutil.which(argv0, path=env.get("PATH", os.defpath))
        if found is None:
            # Distinguish "exists but not executable" the way shells do.
            for directory in env.get("PATH", os.defpath).split(os.pathsep):
                candidate = Path(directory or ".") / argv0
                if candidate.is_file():
                    raise CommandNotExecutableError(f"command not executable: {shown}")
            raise CommandNotFoundError(f"command not found: {shown}")
        return found
    except OSError as exc:  # a name too long, a directory on PATH it may not read
        raise CommandNotFoundError(f"command not found: {shown} ({exc.strerror or exc})") from None


@dataclass
class OutputStream:
    """The parent's end of one of the job's output streams.

    Attributes:
        fd: what trainmedic reads (a pty master or a pipe's read end).
        is_pty: whether the job sees a terminal on this stream.
    """

    fd: int
    is_pty: bool


def same_destination(a: int, b: int) -> bool:
    """Whether descriptors ``a`` and ``b`` lead to the same terminal, pipe or file."""
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    if os.isatty(a) and os.isatty(b):
        return sa.st_rdev == sb.st_rdev
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _winsize(fd: int) -> bytes | None:
    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None


def _open_pty(like_fd: int) -> tuple[int, int]:
    """A pty pair whose slave passes bytes unchanged and has ``like_fd``'s size."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # no "\n" -> "\r\n": the job's bytes pass unchanged
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    size = _winsize(like_fd)
    if size is not None:
        with contextlib.suppress(OSError):
            fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    return master, slave


_HOLDER = (sys.executable, "-I", "-S", str(Path(__file__).with_name("session_holder.py")))
"""The session's holder, run with nothing of the user's Python environment."""


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` exits (Linux 5.3 and
    later), or ``None`` where the system has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _started(popen: subprocess.Popen[bytes], report_fd: int, shown: str) -> int:
    """The job's pid once its program runs, from the holder's report line.

    Raises:
        CommandNotFoundError / CommandNotExecutableError: its ``exec`` failed.
    """
    data = b""
    try:
        while chunk := os.read(report_fd, 64):
            data += chunk
    finally:
        os.close(report_fd)
    kind, _, value = data.decode("ascii", "replace").strip().partition(" ")
    if kind == "ok" and value.isdigit():
        return int(value)
    popen.wait()
    code = int(value) if kind == "err" and value.isdigit() else 0
    name = printable(shown)
    if code == errno.ENOENT:
        raise CommandNotFoundError(f"command not found: {name}")
    if code in (errno.EACCES, errno.EPERM, errno.EISDIR):
        raise CommandNotExecutableError(f"command not executable: {name}")
    if code == errno.ENOEXEC:
        raise CommandNotExecutableError(f"command not executable: {name} (exec format error)")
    if code:
        raise OSError(code, f"{os.strerror(code)}: {name}")
    raise OSError(errno.ECHILD, f"the job's session could not be started (exit {popen.returncode})")


class Job:
    """The user's command, running."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        streams: dict[int, OutputStream],
        token: str = "",
        pid: int | None = None,
    ) -> None:
        self.popen = popen
        # ``popen`` is the session's holder: it leads the session and the
        # process group and ends as the job ends; ``pid`` is the job itself.
        self.pgid = popen.pid
        self.pid = popen.pid if pid is None else pid
        self.streams = streams
        # Processes ever seen in the leader's tree, and our own children that
        # are not the job's, each as (pid, start time): a pid alone may be reused.
        self._members: set[tuple[int, float]] = set()
        self._strangers: set[tuple[int, float]] = set()
        self.token = token
        self._exit_fd = _pidfd(popen.pid)
        if self._exit_fd is not None:
            # Closed with the object, never under a thread still waiting on it.
            weakref.finalize(self, os.close, self._exit_fd)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None = None,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
        merge: bool = False,
    ) -> Job:
        """Start ``argv`` in a new session with the job's output streams captured.

        ``streams`` maps each of ``stdout_fd`` / ``stderr_fd`` to what
        trainmedic reads for it; with ``merge`` only ``stdout_fd`` is there,
        carrying both of the job's streams in the order they were written.

        Raises:
            CommandNotFoundError: exit 127.
            CommandNotExecutableError: exit 126.
        """
        if not argv:
            raise CommandNotFoundError("no command given")
        executable = resolve_command(argv[0], env)
        # Marks the job's processes for good: one that re-parents to trainmedic
        # is told apart from trainmedic's own helpers by it.
        token = f"{os.getpid()}-{secrets.token_hex(6)}"
        env = {**env, JOB_ENV: token}
        streams: dict[int, OutputStream] = {}
        child_ends: dict[int, int] = {}
        try:
            for target in (stdout_fd,) if merge else (stdout_fd, stderr_fd):
                if os.isatty(target):
                    master, slave = _open_pty(target)
                    streams[target] = OutputStream(master, True)
                    child_ends[target] = slave
                else:
                    r, w = os.pipe()
                    streams[target] = OutputStream(r, False)
                    child_ends[target] = w
            report_r, report_w = os.pipe()
            try:
                popen = subprocess.Popen(
                    [*_HOLDER, str(report_w), executable, *argv],
                    executable=sys.executable,
                    env=dict(env),
                    cwd=cwd,
                    stdin=None,
                    stdout=child_ends[stdout_fd],
                    stderr=child_ends[stdout_fd if merge else stderr_fd],
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(report_w,),
                )
            finally:
                os.close(report_w)
            pid = _started(popen, report_r, argv[0])
        except BaseException:
            for s in streams.values():
                with contextlib.suppress(OSError):
                    os.close(s.fd)
            raise
        finally:
            for fd in child_ends.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
        return cls(popen, streams, token, pid)

    # --- observing ---------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The return code, or ``None`` if still running after ``timeout`` seconds.

        With a timeout, the wait sleeps on the holder's pidfd until it exits:
        ``Popen.wait`` would poll, waking the supervisor 11 times in each 0.25 s
        of the attempt loop's watch (on a core it shares with the job) and
        seeing an exit up to 50 ms late."""
        fd = self._exit_fd
        if timeout is not None and fd is not None and self.popen.returncode is None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0.0, timeout) * 1000.0):
                return None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def descendants(self) -> list[ps.Process]:
        """Live processes of the job: the leader's tree while it lives, plus
        processes re-parented to trainmedic (the subreaper) afterwards.

        A child of trainmedic's counts only when it was seen in the job's tree
        before or carries the job's mark (:data:`JOB_ENV`): trainmedic's own
        helpers, or those of a program that embeds it, are never the job's.
        """
        found: dict[int, ps.Process] = {}
        with contextlib.suppress(ps.Error):
            leader = ps.Process(self.pid)
            if leader.status() != ps.STATUS_ZOMBIE:
                found[leader.pid] = leader
            for p in leader.children(recursive=True):
                found[p.pid] = p
        for p in found.values():
            with contextlib.suppress(ps.Error):
                self._members.add((p.pid, p.create_time()))
        with contextlib.suppress(ps.Error):
            for child in ps.Process().children():
                if child.pid in (self.pid, self.pgid) or child.pid in _NOT_THE_JOB:
                    continue
                if child.pid in found:
                    continue
                if not self._is_member(child):
                    continue
                found[child.pid] = child
                with contextlib.suppress(ps.Error):
                    for p in child.children(recursive=True):
                        found.setdefault(p.pid, p)
        return [p for p in found.values() if is_alive(p)]

    def _is_member(self, proc: ps.Process) -> bool:
        """Whether a child of trainmedic's that is not the leader belongs to the job."""
        try:
            key = (proc.pid, proc.create_time())
        except ps.Error:
            return False
        if key in self._members:
            return True
        if key in self._strangers:
            return False
        try:
            marked = bool(self.token) and proc.environ().get(JOB_ENV) == self.token
        except ps.Error:
            marked = False  # gone, or its environment unreadable: not provably ours
        (self._members if marked else self._strangers).add(key)
        return marked

    # --- acting ----------------------------------------------------------------------------

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the job's process group; ``False`` when the group is gone."""
        try:
            os.killpg(self.pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def resize(self, like_fd: int) -> None:
        """Give the job's terminals ``like_fd``'s size and tell its processes."""
        size = _winsize(like_fd)
        if size is None:
            return
        for s in self.streams.values():
            if s.is_pty:
                with contextlib.suppress(OSError):
                    fcntl.ioctl(s.fd, termios.TIOCSWINSZ, size)
        self.signal_group(signal.SIGWINCH)

    def reap_leftovers(
        self, grace_s: float = 3.0, sleep: Callable[[float], None] = time.sleep
    ) -> list[int]:
        """Stop what the job left running (SIGTERM, then SIGKILL after ``grace_s``).

        Returns the pids that had to be stopped.
        """
        left = self.descendants()
        if not left:
            return []
        for p in left:
            with contextlib.suppress(ps.Error):
                p.terminate()
        _, alive = ps.wait_procs(left, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(ps.Error):
                p.kill()
        ps.wait_procs(alive, timeout=1.0)
        self.signal_group(signal.SIGKILL)  # group members psutil could not see
        return [p.pid for p in left]


def is_alive(p: ps.Process) -> bool:
    """Whether ``p`` still runs (a zombie does not count)."""
    try:
        return p.is_running() and p.status() != ps.STATUS_ZOMBIE
    except ps.Error:
        return False
