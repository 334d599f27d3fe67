"""The ``trainmedic`` command line.

Each command lives in its own module (``cli/<name>_cmd.py``) and is registered
here. :func:`main` turns every expected error into one line on stderr and an
exit code: 2 for usage errors, 1 otherwise; it never prints a traceback for
bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from trainmedic import __version__
from trainmedic.errors import TrainmedicError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainmedic")
def cli() -> None:
    """trainmedic: why is my training slow or stuck — and keep it alive.

    \b
    trainmedic doctor            check this machine (GPUs, driver, CPU, memory, disk)
    trainmedic run -- CMD ...    run a training command and diagnose it
    trainmedic report RUN_DIR    show a finished run's report again
    trainmedic compare A B       did a change make run B faster than run A?
    trainmedic demo              a bundled example run
    """


def _register() -> None:
    from trainmedic.cli.doctor_cmd import doctor

    cli.add_command(doctor)
    # Commands of later parts register themselves here when their module exists.
    import importlib

    for name in ("run_cmd", "report_cmd", "demo_cmd", "compare_cmd"):
        try:
            module = importlib.import_module(f"trainmedic.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"trainmedic.cli.{name}":
                raise
            continue
        cli.add_command(module.COMMAND)


_register()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args=args, prog_name="trainmedic", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return 2
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        click.echo(f"trainmedic: error: {_one_line(exc.format_message())}{hint}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("trainmedic: aborted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"trainmedic: error: {_one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except TrainmedicError as exc:
        click.echo(f"trainmedic: error: {_one_line(str(exc))}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("trainmedic: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 1
    return int(result) if isinstance(result, int) else 0


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
