"""The finding: the one shape every diagnosis of trainmedic takes.

doctor (the machine), run (a training job) and the restart supervisor all
report :class:`Finding` objects; the terminal, JSON and HTML reports render
them. The JSON form is documented in docs/findings-schema.md and pinned by
:mod:`trainmedic.findings.schema`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

SCHEMA_VERSION = 1


class Category(str, Enum):
    """The fixed vocabulary of causes (docs/architecture.md, section 1)."""

    GPU_CAPACITY = "gpu_capacity"
    GPU_MEMORY = "gpu_memory"
    NETWORK = "network"
    CPU = "cpu"
    IO = "io"
    FRAMEWORK_CONFIG = "framework_config"
    CONTENTION = "contention"
    DRIVER = "driver"
    MODEL = "model"
    THERMAL = "thermal"
    HARDWARE_FAULT = "hardware_fault"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value


CATEGORY_CAUSE: dict[Category, str] = {
    Category.GPU_CAPACITY: "the GPU too weak for the job, or uneven load across GPUs",
    Category.GPU_MEMORY: "GPU memory short",
    Category.NETWORK: "data over a slow or distant network",
    Category.CPU: "the host CPU is the bottleneck",
    Category.IO: "slow disk or distributed storage",
    Category.FRAMEWORK_CONFIG: "the framework set up badly",
    Category.CONTENTION: "other processes compete for the GPU, CPU or memory",
    Category.DRIVER: "driver, CUDA or OS mismatch",
    Category.MODEL: "the model too heavy for this hardware",
    Category.THERMAL: "heat or power limits slow the GPU",
    Category.HARDWARE_FAULT: "failing hardware",
    Category.TIMEOUT: "hangs, crashes and restarts",
}
"""What each category names, in a few words (docs/architecture.md, section 1): shown
beside the category's name, so that ``timeout`` over a crash reads as meant."""


class Severity(str, Enum):
    """How much a finding matters; ``rank`` orders them (higher is worse)."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]

    def __str__(self) -> str:
        return self.value


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


@dataclass(frozen=True)
class Finding:
    """One diagnosed fact about the machine or the run.

    Attributes:
        id: stable dotted name, e.g. ``thermal.clock_event.hw_slowdown``; the
            same cause always has the same id so tools can track it.
        category: the cause in the catalogue.
        severity: info, warning or error.
        title: one sentence a person reads first.
        evidence: measured values; units are in the key (``temperature_c``,
            ``read_mib_per_s``) or the value (``"4.2 GiB"``).
        fix: a concrete action: a command, a flag or a setting.
        impact: estimated share of time or throughput lost, 0..1, or ``None``
            when it cannot be estimated.
        subject: what the finding is about (``gpu0``, ``host``, a path), used
            to group and to tell apart findings with the same id.
        detail: optional longer explanation.
        apply: what of the fix can be applied without code changes, for
            ``trainmedic run --apply-from`` (docs/remedies.md), e.g.
            ``{"dataloader": {"num_workers": 2}}`` or ``{"torch": {"tf32_matmul": True}}``;
            ``None`` when nothing can.
    """

    id: str
    category: Category
    severity: Severity
    title: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""
    impact: float | None = None
    subject: str | None = None
    detail: str | None = None
    apply: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.impact is not None and not (0.0 <= self.impact <= 1.0):
            raise ValueError(f"impact must be within 0..1, got {self.impact}")
        if self.impact is not None and math.isnan(self.impact):
            raise ValueError("impact must not be NaN")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the required keys first, optional ones when set."""
        out: dict[str, Any] = {
            "id": self.id,
            "category": self.category.value,
            "severity": self.severity.value,
            "title": self.title,
            "evidence": _jsonable(dict(self.evidence)),
            "fix": self.fix,
            "impact": None if self.impact is None else round(self.impact, 4),
        }
        if self.subject is not None:
            out["subject"] = self.subject
        if self.detail is not None:
            out["detail"] = self.detail
        if self.apply:
            out["apply"] = _jsonable(dict(self.apply))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict` (raises ``KeyError``/``ValueError`` on bad data)."""
        return cls(
            id=str(data["id"]),
            category=Category(data["category"]),
            severity=Severity(data["severity"]),
            title=str(data["title"]),
            evidence=dict(data.get("evidence") or {}),
            fix=str(data.get("fix") or ""),
            impact=None if data.get("impact") is None else float(data["impact"]),
            subject=data.get("subject"),
            detail=data.get("detail"),
            apply=dict(data["apply"]) if isinstance(data.get("apply"), Mapping) else None,
        )


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most important first: severity, then impact (unknown last), then id."""

    def key(f: Finding) -> tuple[int, float, str, str]:
        impact = -1.0 if f.impact is None else f.impact
        return (-f.severity.rank, -impact, f.id, f.subject or "")

    return sorted(findings, key=key)


def worst_severity(findings: Iterable[Finding]) -> Severity | None:
    """The highest severity among ``findings``, or ``None`` when empty."""
    worst: Severity | None = None
    for f in findings:
        if worst is None or f.severity.rank > worst.rank:
            worst = f.severity
    return worst


@dataclass(frozen=True)
class FindingsDocument:
    """The machine-readable report: ``{"schema_version", "findings", ...}``.

    Attributes:
        tool: which command produced it (``doctor``, ``run``).
        findings: ranked most important first (``rank_findings`` is applied).
        created_at: Unix time in seconds.
        context: free-form facts about the subject (host name, GPUs, command).
    """

    tool: str
    findings: tuple[Finding, ...]
    created_at: float
    context: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        tool: str,
        findings: Iterable[Finding],
        created_at: float,
        context: Mapping[str, Any] | None = None,
    ) -> FindingsDocument:
        return cls(tool, tuple(rank_findings(findings)), created_at, dict(context or {}))

    def to_dict(self) -> dict[str, Any]:
        counts = {s.value: 0 for s in Severity}
        for f in self.findings:
            counts[f.severity.value] += 1
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": self.tool,
            "created_at": self.created_at,
            "summary": counts,
            "context": _jsonable(dict(self.context)),
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self) -> str:
        """The document as the JSON text trainmedic writes (``findings.json``, ``--json``)."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FindingsDocument:
        return cls(
            tool=str(data.get("tool", "")),
            findings=tuple(Finding.from_dict(f) for f in data["findings"]),
            created_at=float(data.get("created_at", 0.0)),
            context=dict(data.get("context") or {}),
        )


def _jsonable(value: Any) -> Any:
    """Turn tuples, enums and non-finite floats into plain JSON values."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, float):
        return round(value, 6)
    return value
