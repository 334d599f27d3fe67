"""Holds the job's session so that the job itself is not its leader.

The job runs in a session of its own, so that the supervisor can signal
every process it started at once, and so that nothing reaches it from the
terminal that trainmedic does not pass on. But a session leader, and a
process-group leader, cannot call ``setsid()`` (``EPERM``), which a job run
from a script or a launcher may rightly do (daemons, launchers that detach
their workers). So this small process leads the session and the group, and
the job is its child, as the job is a shell script's child without
trainmedic.

Run as a script, with the standard library only, under ``python -I -S``
(nothing of the user's environment or site-packages is loaded)::

    python -I -S session_holder.py REPORT_FD EXECUTABLE ARG0 [ARG...]

It starts ``EXECUTABLE`` with ``ARG0 ARG...`` and its own environment, then
writes one line to ``REPORT_FD`` and closes it: ``ok PID`` once the job's
program is running (after ``exec``), or ``err ERRNO`` when it could not be
started. It then waits for the job and ends as the job ended: the same exit
status, or killed by the same signal (without a core file of its own).

Signals: those sent to the whole group reach the job directly; this process
ignores them all (it must outlive the job to pass its status on) and passes
none on, so the job never receives one twice. The job starts with the
signal dispositions this process was started with, as it would have from
the supervisor directly.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
_KEEP_DEFAULT = {signal.SIGCHLD}
"""The job's end is waited for; ignoring SIGCHLD would make the kernel reap it unasked."""
_RESET_BY_PYTHON = {signal.SIGPIPE, getattr(signal, "SIGXFSZ", signal.SIGPIPE)}
"""Python ignores these at start-up; the supervisor's ``Popen`` had reset them to default."""


def _signals() -> list[signal.Signals]:
    return [s for s in signal.valid_signals() if isinstance(s, signal.Signals) and s < 32]


def _child(executable: str, args: list[str], err_w: int, original: dict[int, object]) -> None:
    """In the forked child: the job's dispositions back, then ``exec``; never returns."""
    try:
        for sig, was in original.items():
            if sig in _RESET_BY_PYTHON or was is not signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
            else:
                signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.execv(executable, args)
    except OSError as exc:
        os.write(err_w, str(exc.errno or 0).encode())
    except BaseException:
        os.write(err_w, b"0")
    finally:
        os._exit(127)


def _end_like(status: int) -> None:
    """Exit as a process whose wait status was ``status``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        # Die by the same signal so the supervisor sees it, but leave no core
        # file: the job wrote its own where it was asked to.
        try:
            _, hard = resource.getrlimit(resource.RLIMIT_CORE)
            resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
        except (ValueError, OSError):
            pass
        if sig not in _UNCATCHABLE:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> None:
    if len(argv) < 4:
        sys.stderr.write("session_holder: usage: REPORT_FD EXECUTABLE ARG0 [ARG...]\n")
        os._exit(2)
    report = int(argv[1])
    executable, args = argv[2], argv[3:]
    os.set_inheritable(report, False)
    catchable = [s for s in _signals() if s not in _UNCATCHABLE and s not in _KEEP_DEFAULT]
    original: dict[int, object] = {int(s): signal.getsignal(s) for s in catchable}
    err_r, err_w = os.pipe()  # close-on-exec: end of file once the job's program runs
    # Blocked across the fork: a signal sent now reaches the child after its
    # dispositions are the job's, and this process after it ignores them.
    signal.pthread_sigmask(signal.SIG_BLOCK, set(catchable))
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        os.close(report)
        _child(executable, args, err_w, original)
    for sig in catchable:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.close(err_w)
    failure = b""
    while chunk := os.read(err_r, 64):
        failure += chunk
    os.close(err_r)
    line = f"err {int(failure)}\n" if failure.isdigit() else f"ok {pid}\n"
    try:
        os.write(report, line.encode())
        os.close(report)
    except OSError:
        pass  # the supervisor is gone: the job runs on, and its status still ends here
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
    _end_like(status)


if __name__ == "__main__":
    main(sys.argv)
