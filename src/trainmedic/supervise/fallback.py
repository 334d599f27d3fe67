"""When the supervisor's own code fails mid-run: the job runs on, its exit status is kept.

:func:`run_on_unsupervised` is what :class:`~trainmedic.supervise.session.RunSession`
falls back to when the attempt loop raises while a job runs: supervision
(hang detection, restarts) stops, the job runs on to its end with its output
and signals still passed on, and its exit status is still trainmedic's.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable

from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent
from trainmedic.supervise.loop.attempt_setup import LoopResult
from trainmedic.supervise.loop.attempts import LEFTOVER_GRACE_S, OUTPUT_DRAIN_S, AttemptLoop

SUPERVISOR_ERROR = EventKind.SUPERVISOR_ERROR
"""Event kind of a supervisor bug that stopped the supervision of a running job."""


def run_on_unsupervised(
    loop: AttemptLoop,
    exc: Exception,
    notice: Callable[[str], None],
    add_event: Callable[[RunEvent], None],
    wall: Callable[[], float],
    wait_s: float = 0.5,
) -> LoopResult:
    """The attempt loop failed with ``exc`` while its job runs: let the job finish.

    Signals are still forwarded (the caller's handlers stay installed) and the
    output still flows (the pumps are threads of their own); only hang
    detection and restarts are gone. Returns the job's own result.
    """
    assert loop.current is not None
    job = loop.current.job
    notice(
        f"internal error ({type(exc).__name__}: {' '.join(str(exc).split())}): supervision "
        f"stops here; the job (pid {job.pid}) runs on to its end"
    )
    with contextlib.suppress(Exception):
        add_event(
            RunEvent(
                t=wall(),
                kind=SUPERVISOR_ERROR,
                message=f"supervision stopped by an internal error: {type(exc).__name__}: {exc}",
                pid=job.pid,
                data={"traceback": "".join(traceback.format_exception(exc))[-8000:]},
            )
        )
    while job.wait(wait_s) is None:
        pass
    for pump in loop.pumps:
        pump.join(OUTPUT_DRAIN_S)
    leftovers = job.reap_leftovers(LEFTOVER_GRACE_S)
    returncode = job.returncode if job.returncode is not None else 0
    return LoopResult(returncode, wall(), attempts=(), leftovers=tuple(leftovers))
