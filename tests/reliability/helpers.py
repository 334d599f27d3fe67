"""Shared helpers of the reliability suites: run the CLI, check its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

TRAINMEDIC = [sys.executable, "-m", "trainmedic"]


def trainmedic(
    *args: str | bytes | Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[bytes]:
    """``python -m trainmedic ARGS`` with its output captured."""
    return subprocess.run(
        [*TRAINMEDIC, *args],
        capture_output=True,
        cwd=cwd,
        env=None if env is None else dict(env),
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(got: subprocess.CompletedProcess[bytes], code: int = 2) -> str:
    """The command failed with ``code`` and exactly one line on stderr, no traceback."""
    err = got.stderr.decode("utf-8", "replace")
    assert got.returncode == code, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trainmedic: error: "), err
    return lines[0]


def python_job(code: str, *args: str | bytes) -> list[str | bytes]:
    """A job: ``python -c CODE ARGS``."""
    return [sys.executable, "-c", code, *args]


def listing(directory: Path) -> list[str]:
    """Every path under ``directory``, relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def can_drop_read_permission() -> list[str] | None:
    """A command prefix under which a file of mode 000 is unreadable, or ``None``.

    As root, file modes do not apply; ``setpriv`` without the two DAC
    capabilities makes them apply again.
    """
    if os.geteuid() != 0:
        return []
    setpriv = "/usr/bin/setpriv"
    if not os.path.exists(setpriv):
        return None
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
