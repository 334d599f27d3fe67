"""A Python process of the job that ran for a while without the probe: the diagnosis is blind.

The supervisor's process census (a ``process_census`` event per attempt)
lists every Python process of the job's tree with how long it ran, its CPU
and what its environment held. One that lived at least
``PROBE_MISSING_MIN_S`` and never said hello (no ``process_start`` event, no
steps) ran unmeasured: whatever it did is missing from the diagnosis. The
finding says what was seen and how to fix it, from the evidence: the
supervisor's variables gone from its environment (a launch script or
scheduler cleared it), an interpreter flag that skips start-up files
(``-S``), a ``PYTHONPATH`` replaced for an interpreter whose environment has
no trainmedic start-up hook, or a probe that failed to load
(``bootstrap-errors.log``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.events import EventKind

PROBE_MISSING_MIN_S = 5.0
"""A Python process that ran this long connects (the probe speaks after 0.2 s)."""
MAX_LISTED = 5


def probe_reach(view: RunView, th: Thresholds) -> list[Finding]:
    """A warning for Python processes that ran ``PROBE_MISSING_MIN_S`` without the probe."""
    reached = set(view.pids)
    failed: dict[int, str] = {}
    for e in view.record.events:
        bootstrap = e.data.get("part") == "bootstrap"
        if e.kind == EventKind.PROBE_ERROR and bootstrap and e.pid is not None:
            failed.setdefault(e.pid, e.message)
    blind: list[Mapping[str, Any]] = []
    probe_on = False
    for e in view.record.events:
        if e.kind != EventKind.PROCESS_CENSUS or not e.data.get("probe"):
            continue
        probe_on = True
        for p in e.data.get("processes") or ():
            if (
                isinstance(p, Mapping)
                and p.get("python")
                and isinstance(p.get("pid"), int)
                and p["pid"] not in reached
                and float(p.get("lived_s") or 0.0) >= PROBE_MISSING_MIN_S
            ):
                blind.append(p)
    if not probe_on or not blind:
        return []
    blind.sort(key=lambda p: (-float(p.get("cpu_s") or 0.0), -float(p.get("lived_s") or 0.0)))
    first = blind[0]
    steps = view.summary.steps_total
    seen = (
        f"{len(blind)} Python process{'es' if len(blind) > 1 else ''} ran without the probe "
        f"(longest {max(float(p.get('lived_s') or 0) for p in blind):.0f} s)"
    )
    title = (
        f"The probe never reached the training: {seen}; {steps} steps seen"
        if steps == 0
        else f"The diagnosis misses part of the job: {seen}"
    )
    reason, fix = _why(first, failed.get(int(first["pid"])))
    return [
        Finding(
            id="probe.not_loaded",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title=title,
            evidence={
                "processes": [_describe(p) for p in blind[:MAX_LISTED]],
                "processes_without_probe": len(blind),
                "steps_seen": steps,
                "reason": reason,
                "min_lifetime_s": PROBE_MISSING_MIN_S,
            },
            fix=fix,
            impact=None,
            subject=f"pid {first['pid']}",
        )
    ]


def _describe(p: Mapping[str, Any]) -> dict[str, Any]:
    argv = p.get("argv") or []
    return {
        "pid": p.get("pid"),
        "command": " ".join(str(a) for a in argv)[:300] if argv else p.get("name"),
        "interpreter": p.get("exe"),
        "lived_s": p.get("lived_s"),
        "cpu_s": p.get("cpu_s"),
        "pythonpath": p.get("pythonpath"),
        "probe_variables": p.get("probe_env"),
        "flags": p.get("flags") or [],
    }


def _why(p: Mapping[str, Any], error: str | None) -> tuple[str, str]:
    """(what went wrong, how to fix it) for one process without the probe."""
    interpreter = p.get("exe") or "this interpreter"
    flags: Sequence[str] = p.get("flags") or ()
    if error is not None:
        return (
            f"the probe failed to load: {error}",
            "See bootstrap-errors.log in the run directory; the probe needs Python 3.10 or "
            "newer in the job's interpreter.",
        )
    if p.get("probe_env") is False:
        return (
            "trainmedic's variables were not in its environment (cleared by the launch "
            "script, env -i, sudo, or a scheduler that starts jobs with a clean environment)",
            "Pass the environment through: keep the TRAINMEDIC_* variables (env -i ... "
            "TRAINMEDIC_PROBE_ADDR=$TRAINMEDIC_PROBE_ADDR ..., sudo --preserve-env, srun "
            "--export=ALL), or run trainmedic inside the launch script: trainmedic run -- "
            "python train.py.",
        )
    if "-S" in flags:
        return (
            "Python ran with -S, which skips site-packages start-up files and sitecustomize",
            "Drop -S from the interpreter's flags so the probe can start.",
        )
    if p.get("bootstrap_on_path") is False:
        return (
            f"the launch script replaced PYTHONPATH ({p.get('pythonpath')!r}) and {interpreter} "
            "has no trainmedic start-up hook (trainmedic is not installed in its environment)",
            f"Install trainmedic into that interpreter's environment ({interpreter} -m pip "
            "install trainmedic) so its start-up hook loads the probe, or extend PYTHONPATH "
            "instead of replacing it: export PYTHONPATH=/your/path:$PYTHONPATH.",
        )
    return (
        "the probe did not start in it",
        "Run the training script directly under trainmedic (trainmedic run -- python "
        "train.py) or mark its steps with trainmedic.step(); see bootstrap-errors.log in the "
        "run directory.",
    )
