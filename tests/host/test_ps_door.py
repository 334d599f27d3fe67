"""psutil has one door (trainmedic.host.ps): no other module imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import trainmedic
from trainmedic.host import ps

SRC = Path(trainmedic.__file__).parent


def psutil_importers() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom)
                else []
            )  # fmt: skip
            if any(n == "psutil" or n.startswith("psutil.") for n in names):
                found.append(str(path.relative_to(SRC)))
    return found


def test_only_the_door_imports_psutil() -> None:
    assert psutil_importers() == ["host/ps.py"]


def test_the_door_exports_what_it_lists() -> None:
    assert all(callable(getattr(ps, name)) or isinstance(getattr(ps, name), str)
               for name in ps.__all__)  # fmt: skip
    assert issubclass(ps.NoSuchProcess, ps.Error) and issubclass(ps.AccessDenied, ps.Error)
