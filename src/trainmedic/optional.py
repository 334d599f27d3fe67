"""Optional dependencies: what a path needs beyond a plain install, and how to get it.

A plain ``pip install trainmedic`` brings what the supervisor, ``doctor`` and
the reports need (pyproject.toml says which code uses each). Paths that need
more (the demo's torch and numpy, py-spy for native stacks) ask here first,
without importing anything, and say in one line which extra to install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from trainmedic.errors import UsageError


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (a name under ``[project.optional-dependencies]``)."""
    return f"pip install 'trainmedic[{extra}]'"


def missing_modules(modules: Sequence[str]) -> list[str]:
    """Those of ``modules`` (top-level import names) that this interpreter cannot import."""
    absent: list[str] = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or half-removed package
            found = False
        if not found:
            absent.append(name)
    return absent


def require(what: str, modules: Sequence[str], extra: str) -> None:
    """Raise a one-line :class:`~trainmedic.errors.UsageError` when ``what`` cannot run
    here because some of ``modules`` are not installed."""
    absent = missing_modules(modules)
    if absent:
        names = " and ".join(absent)
        verb = "is" if len(absent) == 1 else "are"
        raise UsageError(f"{what} needs {names}, which {verb} not installed: {install_hint(extra)}")
