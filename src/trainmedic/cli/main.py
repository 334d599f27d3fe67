"""The ``trainmedic`` command line.

Each command lives in its own module (``cli/<name>_cmd.py``) and is registered
here. :func:`main` turns every error into one line on stderr and an exit
code: 2 for usage errors, 1 otherwise. It never prints a traceback: an error
no check foresaw (a bug) is one line too, with ``TRAINMEDIC_DEBUG=1`` to see
its traceback.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import click

from trainmedic import __version__
from trainmedic.cli import (
    attach_cmd,
    bench_cmd,
    compare_cmd,
    demo_cmd,
    doctor_cmd,
    report_cmd,
    run_cmd,
    tune_cmd,
)
from trainmedic.errors import TrainmedicError
from trainmedic.ostext import printable


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainmedic")
def cli() -> None:
    """trainmedic: why is my training slow or stuck — and keep it alive.

    \b
    trainmedic doctor            check this machine (GPUs, driver, CPU, memory, disk)
    trainmedic run -- CMD ...    run a training command and diagnose it
    trainmedic attach PID        why a job already running is slow, or whether it is stuck
    trainmedic report RUN_DIR    show a finished run's report again
    trainmedic compare A B       did a change make run B faster than run A?
    trainmedic bench -- A ::: B  run commands A and B in turns, and compare them
    trainmedic demo              a bundled example run
    trainmedic tune dataloader M:F  find faster DataLoader settings (tune --help)
    """


for _command in (
    doctor_cmd.COMMAND,
    run_cmd.COMMAND,
    attach_cmd.COMMAND,
    report_cmd.COMMAND,
    demo_cmd.COMMAND,
    tune_cmd.COMMAND,
    compare_cmd.COMMAND,
    bench_cmd.COMMAND,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    _open_std_fds()
    _tolerant_stdio()
    _survive_closed_stdout()
    try:
        result = cli.main(args=args, prog_name="trainmedic", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return 2
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        _error(f"{_usage_message(exc)}{hint}")
        return 2
    except click.exceptions.Abort:
        _error("aborted", prefix="trainmedic: ")
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        _error(exc.format_message())
        return exc.exit_code
    except TrainmedicError as exc:
        _error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted", prefix="trainmedic: ")
        return 130
    except BrokenPipeError:
        # Only where stdout could not be wrapped (a stream that is not a descriptor).
        _quiet_stdout()
        return 1
    except OSError as exc:
        # A file the command touched failed in a way no check foresaw.
        where = f"{printable(os.fsdecode(exc.filename))}: " if exc.filename else ""
        _error(f"{where}{exc.strerror or exc}")
        return 1
    except (RecursionError, MemoryError) as exc:
        _error(f"input too large or too deeply nested ({type(exc).__name__})")
        return 1
    except Exception as exc:
        # A bug: still one line, with what a bug report needs.
        if os.environ.get("TRAINMEDIC_DEBUG"):
            raise
        _error(
            f"internal error: {type(exc).__name__}: {exc} "
            "(run with TRAINMEDIC_DEBUG=1 for the traceback, and please report it)"
        )
        return 1
    return int(result) if isinstance(result, int) else 0


def _error(message: str, prefix: str = "trainmedic: error: ") -> None:
    """One line on stderr; a closed stderr is not an error of its own."""
    with contextlib.suppress(OSError):
        click.echo(f"{prefix}{_one_line(message)}", err=True)


def _usage_message(exc: click.UsageError) -> str:
    """The usage error, with the single likeliest option for an unknown one."""
    if isinstance(exc, click.exceptions.NoSuchOption):
        best = difflib.get_close_matches(exc.option_name, exc.possibilities or (), n=1, cutoff=0)
        hint = f" (did you mean {best[0]}?)" if best else ""
        return f"no such option {exc.option_name}{hint}"
    return exc.format_message()


def _open_std_fds() -> None:
    """Open /dev/null on a standard descriptor the caller closed (``>&-``).

    Otherwise the next file trainmedic opens (a record file) would get that
    number, and what is meant for stdout would be written into the record.
    """
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            return
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            mode = "r" if fd == 0 else "w"
            setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8"))  # noqa: SIM115


def _tolerant_stdio() -> None:
    """Undecodable arguments and file names print as ``\\udcff`` instead of raising."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


class _ReaderGoneSafeStdout(io.RawIOBase):
    """stdout's descriptor, whose reader going away (``| head -3``) is not an error:
    from the first failed write on, output goes to /dev/null, so the command finishes
    its work and exits with the status it would have had."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.reader_gone = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        size = len(memoryview(data))
        if self.reader_gone:
            return size
        try:
            return os.write(self._fd, data)
        except BrokenPipeError:
            self.reader_gone = True
            _quiet_stdout()
            return size


def _survive_closed_stdout() -> None:
    """Put :class:`_ReaderGoneSafeStdout` under ``sys.stdout``, once, and only over the
    process's own stdout (a test's captured stream is left alone). Every writer (click,
    rich, ``print``) goes through ``sys.stdout``, so none sees the closed pipe."""
    stream: TextIO = sys.stdout
    if stream is None or sys.__stdout__ is None or id(stream) != id(sys.__stdout__):
        return
    try:
        fd = stream.fileno()
        stream.flush()
    except (OSError, ValueError, AttributeError):
        return
    raw = _ReaderGoneSafeStdout(fd)
    # Buffered as the stream it replaces: unbuffered under ``python -u`` or
    # PYTHONUNBUFFERED (so that its lines keep their place among the job's, which
    # the run writes to the descriptor directly), by line on a terminal.
    unbuffered = bool(getattr(stream, "write_through", False))
    layer: Any = raw if unbuffered else io.BufferedWriter(raw)
    wrapped = io.TextIOWrapper(
        layer,
        encoding=stream.encoding,
        errors="backslashreplace",
        line_buffering=bool(getattr(stream, "line_buffering", False)),
        write_through=unbuffered,
    )
    sys.stdout = wrapped


def _quiet_stdout() -> None:
    """stdout's reader is gone: send what is left in its buffer nowhere, so the
    interpreter's final flush cannot fail (and turn the exit status into 120)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _one_line(message: str) -> str:
    return printable(" ".join(message.split()))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
