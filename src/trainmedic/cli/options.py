"""Options and output helpers shared by several commands."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from trainmedic.findings.model import Finding, Severity

F = TypeVar("F", bound=Callable[..., Any])

FAIL_ON_CHOICES = ("info", "warning", "error", "never")


class FiniteRange(click.FloatRange):
    """A :class:`click.FloatRange` that refuses ``nan`` and ``inf`` (a ``nan`` passes every
    range check, as no comparison with it is true)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.isascii():
            # float() reads "٣" as 3: a number on the command line is written in ASCII.
            self.fail(f"{value!r} is not a number written in ASCII digits.", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def simulate_option(fn: F) -> F:
    """``--simulate FILE``: read GPUs (and optionally torch/host) from a simulation file."""
    return click.option(
        "--simulate",
        metavar="FILE",
        default=None,
        help="Use a simulated machine described by FILE instead of the real GPUs "
        "(format: docs/simulation-format.md; examples in examples/simulations/).",
    )(fn)


def json_option(what: str, note: str = "") -> Callable[[F], F]:
    """``--json [FILE]``: write ``what`` as JSON to FILE, or to stdout when the
    flag comes without one (the value is then ``"-"``)."""
    return click.option(
        "--json",
        "json_out",
        is_flag=False,
        flag_value="-",
        default=None,
        metavar="[FILE]",
        help=f"Write {what} as JSON to FILE, or to stdout when no FILE is given{note}.",
    )


def exit_code_for(findings: Iterable[Finding], fail_on: str) -> int:
    """1 when a finding reaches the ``--fail-on`` severity, else 0."""
    if fail_on == "never":
        return 0
    threshold = Severity(fail_on).rank
    return 1 if any(f.severity.rank >= threshold for f in findings) else 0
