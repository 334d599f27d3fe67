"""Remedies report what they did to the run record when the job runs under ``trainmedic run``.

The probe in each process (the training process and every DataLoader worker)
forwards :class:`~trainmedic.record.types.RunEvent` records to the supervisor,
which keeps them in ``events.jsonl``. Outside a run these calls are no-ops
costing a dictionary lookup, like :mod:`trainmedic.api`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from trainmedic.record.events import EventKind

_RUNTIME = "trainmedic.probe.runtime"


def report_event(kind: EventKind, message: str, data: Mapping[str, Any] | None = None) -> bool:
    """Send one event to the run record; ``False`` when no probe is active here."""
    runtime = sys.modules.get(_RUNTIME)
    probe = None if runtime is None else runtime.current()
    if probe is None:
        return False
    try:
        from trainmedic.record.types import RunEvent

        probe.emit(
            RunEvent(
                t=time.time(), kind=kind, message=message, pid=os.getpid(), data=dict(data or {})
            )
        )
    except Exception:
        return False  # reporting must never break the job
    return True
