"""``trainmedic run`` whose supervision breaks mid-run: the watchdog raises once the job runs.

Usage: buggy_supervisor_run.py RUN-ARGS...

Stands in for any bug of the supervisor's own code while a job runs, to show
that the job still runs to its end and its exit status is still trainmedic's.
"""

from __future__ import annotations

import sys

from trainmedic.cli.main import main
from trainmedic.supervise.hang import watchdog

original = watchdog.Watchdog.check
calls = 0


def broken_check(self: watchdog.Watchdog, now: float) -> object:
    global calls
    calls += 1
    if calls >= 2:
        raise RuntimeError("a bug in the supervisor")
    return original(self, now)


watchdog.Watchdog.check = broken_check  # type: ignore[method-assign,assignment]
sys.exit(main(sys.argv[1:]))
