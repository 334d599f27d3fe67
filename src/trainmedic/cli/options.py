"""Options and output helpers shared by several commands."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click

from trainmedic.errors import InputError
from trainmedic.findings.model import Finding, Severity

F = TypeVar("F", bound=Callable[..., Any])

FAIL_ON_CHOICES = ("info", "warning", "error", "never")


def simulate_option(fn: F) -> F:
    """``--simulate FILE``: read GPUs (and optionally torch/host) from a simulation file."""
    return click.option(
        "--simulate",
        metavar="FILE",
        default=None,
        help="Use a simulated machine described by FILE instead of the real GPUs "
        "(format: docs/simulation-format.md; examples in examples/simulations/).",
    )(fn)


def exit_code_for(findings: Iterable[Finding], fail_on: str) -> int:
    """1 when a finding reaches the ``--fail-on`` severity, else 0."""
    if fail_on == "never":
        return 0
    threshold = Severity(fail_on).rank
    return 1 if any(f.severity.rank >= threshold for f in findings) else 0


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` via a temporary file, so a failure
    never leaves a half-written file in place of an earlier one."""
    if path.is_dir():
        raise InputError(f"--json {path}: is a directory")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
