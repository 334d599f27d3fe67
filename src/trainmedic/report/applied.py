"""What ``run --apply-from`` changed inside the job, read back from the run record's events.

The probe reports each change (``remedy_applied``), each fallback to the
script's own settings (``remedy_reverted``), each planned change it left out
(``remedy_not_applied``) and each the script undid (``remedy_overridden``).
Processes that did the same thing (ranks, say) are shown once with their count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from trainmedic.record.events import EventKind
from trainmedic.record.types import RunRecord

APPLY_KINDS = (
    EventKind.REMEDY_APPLIED,
    EventKind.REMEDY_REVERTED,
    EventKind.REMEDY_NOT_APPLIED,
    EventKind.REMEDY_OVERRIDDEN,
)
_MARK = {
    "remedy_applied": ("✓", "green"),
    "remedy_reverted": ("↺", "yellow"),
    "remedy_not_applied": ("–", "dim"),
    "remedy_overridden": ("!", "yellow"),
}


@dataclass(frozen=True)
class AppliedChange:
    """One kind of change, as reported by ``processes`` processes."""

    kind: str
    message: str
    processes: int


def applied_changes(record: RunRecord) -> list[AppliedChange]:
    """The ``--apply-from`` events of ``record``, one per distinct message, in order."""
    seen: dict[tuple[str, str], set[int | None]] = {}
    for e in record.events:
        if e.kind in APPLY_KINDS:
            seen.setdefault((e.kind, e.message), set()).add(e.pid)
    return [AppliedChange(kind, message, len(pids)) for (kind, message), pids in seen.items()]


def nothing_changed(plan: Mapping[str, Any] | None) -> str:
    """Why a run with ``--apply-from`` changed nothing, from its plan (``ApplyPlan.to_dict``)."""
    if not plan:
        return "nothing was changed in the job"
    loader, switches = plan.get("dataloader") or {}, plan.get("switches") or {}
    if not loader and not switches:
        reasons = plan.get("reasons") or {}
        why = "; ".join(f"{k}: {v}" for k, v in list(reasons.items())[:3]) or "it was empty"
        return f"nothing was changed in the job: the plan had nothing to apply ({why})"
    parts = []
    if loader:
        types = ", ".join(plan.get("dataset_types") or ()) or "a map-style dataset"
        parts.append(f"no DataLoader over {types} was made")
    if switches:
        parts.append("torch was not imported with CUDA")
    return (
        "nothing was changed in the job: " + " and ".join(parts)
        + " (each change the probe makes is listed here)"
    )  # fmt: skip


def render_applied(
    console: Console,
    record: RunRecord,
    source: str | None = None,
    plan: Mapping[str, Any] | None = None,
) -> None:
    """Print the changes (nothing when the run applied nothing and had no plan); when
    it changed nothing, why (from ``plan``)."""
    changes = applied_changes(record)
    if not changes and source is None:
        return
    title = "applied fixes" + (f" (--apply-from {source})" if source else "")
    console.print(Text(title, style="bold underline"))
    if not changes:
        console.print(Text(f"  {nothing_changed(plan)}", style="dim"))
    for change in changes:
        mark, style = _MARK[change.kind]
        line = Text(f"  {mark} ", style=style)
        line.append(change.message)
        if change.processes > 1:
            line.append(f" ({change.processes} processes)", style="dim")
        console.print(line)
    console.print()
