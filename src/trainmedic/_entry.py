"""The ``trainmedic`` command's entry: Ctrl-C while the command line loads is one line.

Loading the command line (click, rich, the commands) takes a few tens of
milliseconds, before :func:`trainmedic.cli.main.main` handles ``KeyboardInterrupt``
itself; a Ctrl-C in that window printed a traceback. This module imports
nothing but :mod:`sys` and :mod:`contextlib` first.
"""

from __future__ import annotations

import contextlib
import sys


def main() -> int:
    """Load the command line and run it; 130 and one line when interrupted meanwhile."""
    try:
        from trainmedic.cli.main import main as run
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("trainmedic: interrupted\n")
        return 130
    return run()
