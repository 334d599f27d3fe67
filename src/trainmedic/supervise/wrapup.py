"""The end of a supervised run: what is gathered, what is kept, and the fallbacks.

* :func:`run_on_unsupervised` — a bug of the supervisor mid-run costs the
  job nothing: supervision stops, the job runs on to its end, and its exit
  status is still trainmedic's;
* :func:`bootstrap_errors`, :func:`run_environment` — what the final record
  says about the probes that failed to load and the machine;
* :func:`discard_run_dir` — a job that never started leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.probe import env as probe_env
from trainmedic.record.types import RunEvent
from trainmedic.supervise.attempts import (
    LEFTOVER_GRACE_S,
    OUTPUT_DRAIN_S,
    AttemptLoop,
    LoopResult,
)
from trainmedic.supervise.processes import ProcessTable

SUPERVISOR_ERROR = "supervisor_error"
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


def bootstrap_errors(run_dir: Path) -> list[RunEvent]:
    """Probe bootstraps that failed to load leave a line each; they become events."""
    path = run_dir / probe_env.BOOTSTRAP_ERRORS
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines[:100]:
        pid_text, _, message = line.partition(" ")
        events.append(
            RunEvent(
                t=path.stat().st_mtime,
                kind="probe_error",
                message=f"probe could not load: {message}",
                pid=int(pid_text) if pid_text.isdigit() else None,
                data={"part": "bootstrap"},
            )
        )
    return events


def run_environment(
    machine: MachineFacts | None, table: ProcessTable, simulate: str | None
) -> dict[str, Any]:
    """The machine and the job's torch, as JSON-ready data for meta.json."""
    env: dict[str, Any] = {"simulation": simulate}
    if machine is not None:
        host = machine.host
        env["host"] = {
            "hostname": host.hostname,
            "logical_cores": host.cpu.logical_cores,
            "usable_cores": host.cpu.usable_cores,
            "memory_total_bytes": host.memory.total_bytes,
        }
        env["gpu"] = {
            "backend": machine.gpu.backend,
            "driver": None if machine.gpu.driver is None else machine.gpu.driver.version,
            "absent_reason": machine.gpu.absent_reason,
            "gpus": [
                {
                    "index": s.index,
                    "name": s.name,
                    "uuid": s.uuid,
                    "memory_total_bytes": s.memory_total_bytes,
                }
                for s in machine.gpu.samples
            ],
        }
    info = table.torch_info()
    if info is not None:
        env["torch"] = {
            "version": info.version,
            "cuda_version": info.cuda_version,
            "cudnn_version": info.cudnn_version,
            "cuda_initialized": info.cuda_initialized,
            "devices": list(info.devices),
        }
    elif machine is not None and machine.torch is not None:
        env["torch"] = {
            "version": machine.torch.version,
            "cuda_version": machine.torch.cuda_version,
        }
    env["processes"] = len(table.snapshot())
    return env


def discard_run_dir(run_dir: Path, remove_dir: bool) -> None:
    """Remove what this run wrote when its job never started (the directory was
    empty or new: everything in it is ours)."""
    for entry in list(run_dir.iterdir()) if run_dir.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    if remove_dir:
        with contextlib.suppress(OSError):
            run_dir.rmdir()
