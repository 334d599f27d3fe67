"""/dev/shm: DataLoader workers hand batches to the main process through shared memory.

A bus error (or the job killed by SIGBUS) with workers is ``input.shm_exhausted``;
with doctor's facts, a ``/dev/shm`` under ``shm_min_bytes`` while workers run is
``input.shm_small`` (docs/diagnosis.md, "/dev/shm").
"""

from __future__ import annotations

import re
from typing import Any

from trainmedic.diagnose.thresholds import MIB, Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.fixes import SHM_FIX_WITH_WORKERS
from trainmedic.findings.model import Category, Finding, Severity

_SHM_TEXT = re.compile(r"bus error|shared memory|/dev/shm|shm_open|sigbus", re.IGNORECASE)
_SIGBUS = 7


def shm_too_small(view: RunView, th: Thresholds) -> list[Finding]:
    """Workers pass batches through ``/dev/shm``: a bus error, or a ``/dev/shm`` under
    ``shm_min_bytes`` while workers run."""
    workers = max((lo.num_workers for lo in view.record.loaders), default=None)
    events = [e for e in view.record.events if _SHM_TEXT.search(f"{e.message} {e.data}")]
    sigbus = view.record.meta.exit_code == -_SIGBUS
    shm = view.machine.host.shm if view.machine is not None else None
    ev: dict[str, Any] = {"num_workers": workers}
    if shm is not None:
        ev["shm_path"] = shm.path
        ev["shm_total_bytes"] = shm.total_bytes
        ev["shm_free_bytes"] = shm.free_bytes
        ev["shm_min_bytes"] = th.shm_min_bytes
    fix = SHM_FIX_WITH_WORKERS
    if events or (sigbus and workers):
        ev["shm_events"] = len(events)
        ev["exit_code"] = view.record.meta.exit_code
        if events:
            ev["first_event"] = events[0].message[:200]
        return [
            Finding(
                id="input.shm_exhausted",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.ERROR,
                title="DataLoader workers ran out of shared memory (/dev/shm)",
                evidence=ev,
                fix=fix,
                impact=None,
                subject=shm.path if shm is not None else "/dev/shm",
            )
        ]
    if (
        workers
        and shm is not None
        and shm.total_bytes is not None
        and shm.total_bytes < th.shm_min_bytes
    ):
        return [
            Finding(
                id="input.shm_small",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.WARNING,
                title=(
                    f"/dev/shm holds only {shm.total_bytes / MIB:.0f} MiB for {workers} "
                    "DataLoader workers"
                ),
                evidence=ev,
                fix=fix,
                impact=None,
                subject=shm.path,
            )
        ]
    return []
