"""The probe measured less than usual: the job's torch lacks an API it hooks.

Each Python process whose torch misses a hooked API sends a ``probe_degraded``
event (:mod:`trainmedic.probe.torch_features`): the torch version, each
missing API with the release that brought it, what is not measured and the
probe parts switched off. One ``probe.degraded`` finding (info) gathers them,
so the report says which numbers the diagnosis had to do without.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent


def probe_coverage(view: RunView, th: Thresholds) -> list[Finding]:
    """``probe.degraded`` when any process's probe ran with parts of torch missing."""
    return probe_degraded(view.record.events)


def probe_degraded(events: Iterable[RunEvent]) -> list[Finding]:
    """One finding for all ``probe_degraded`` events (none without them): torch's, and
    Keras's (:mod:`trainmedic.probe.keras_hooks`) in one of their own."""
    seen = [e for e in events if e.kind == EventKind.PROBE_DEGRADED]
    keras = [e for e in seen if e.data.get("framework") == "keras"]
    seen = [e for e in seen if e.data.get("framework") != "keras"]
    found = _keras_degraded(keras) if keras else []
    if not seen:
        return found
    return found + _torch_degraded(seen)


def _keras_degraded(seen: list[RunEvent]) -> list[Finding]:
    versions = sorted({str(e.data.get("keras")) for e in seen})
    lost: list[str] = []
    apis: list[str] = []
    for e in seen:
        for item in e.data.get("lost") or ():
            if str(item) not in lost:
                lost.append(str(item))
        for gap in e.data.get("missing") or ():
            if isinstance(gap, Mapping) and str(gap.get("api")) not in apis:
                apis.append(str(gap.get("api")))
    multi = "data wait" in lost and not apis
    fix = (
        "Keras runs several steps per call (steps_per_execution): set it to 1 while "
        "diagnosing to measure each step's wait for data."
        if multi
        else "Use Keras 3 on TensorFlow 2.16 or newer (where the probe finds every hook) to "
        "measure everything; the rest of the diagnosis stands."
    )
    return [
        Finding(
            id="probe.degraded",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.INFO,
            title=f"The probe measured less with Keras {', '.join(versions)}: not measured: "
            + ", ".join(lost),
            evidence={
                "keras": versions,
                "missing_apis": apis,
                "not_measured": lost,
                "processes": sorted({e.pid for e in seen if e.pid is not None}),
            },
            fix=fix,
            impact=None,
            subject="probe",
        )
    ]


def _torch_degraded(seen: list[RunEvent]) -> list[Finding]:
    first = seen[0].data
    versions = sorted({str(e.data.get("torch")) for e in seen})
    missing: dict[str, Mapping[str, Any]] = {}
    parts_off: list[str] = []
    for e in seen:
        for gap in e.data.get("missing") or ():
            if isinstance(gap, Mapping):
                missing.setdefault(str(gap.get("feature")), gap)
        for part in e.data.get("parts_off") or ():
            if part not in parts_off:
                parts_off.append(str(part))
    supported = str(first.get("supported_from") or "2.0")
    newest = max((str(g.get("since")) for g in missing.values()), default=supported)
    lost = [str(g.get("lost")) for g in missing.values()]
    old = any(e.data.get("older_than_supported") for e in seen)
    title = f"The probe measured less with torch {', '.join(versions)}"
    if old:
        title += f" (older than {supported}, the oldest supported release)"
    if missing:
        title += f": {len(missing)} API(s) it hooks are missing"
    if parts_off:
        title += f", probe parts off: {', '.join(parts_off)}"
    return [
        Finding(
            id="probe.degraded",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.INFO,
            title=title,
            evidence={
                "torch": versions,
                "missing_apis": [
                    {
                        "api": g.get("api"),
                        "since": g.get("since"),
                        "part": g.get("part"),
                        "lost": g.get("lost"),
                    }
                    for g in missing.values()
                ],
                "parts_off": parts_off,
                "processes": sorted({e.pid for e in seen if e.pid is not None}),
                "supported_from": supported,
            },
            fix=(
                f"Upgrade torch to {max(newest, supported, key=_release)} or newer in the "
                "job's environment (keep the CUDA build matched to the driver) to measure "
                "everything; the rest of the diagnosis stands."
            ),
            impact=None,
            subject="probe",
            detail="Not measured: " + "; ".join(lost) + "." if lost else None,
        )
    ]


def _release(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in version.split("."))
    except ValueError:
        return (0,)
