"""Reading a findings document back from a file, whatever the file holds.

``findings.json`` sits in a run directory a user may have edited, truncated
or replaced. :func:`read_findings_document` reads it bounded
(:mod:`trainmedic.jsonfile`), checks the shape field by field and raises
:class:`~trainmedic.errors.RunDirectoryError` naming the file and the first
field that is wrong; it never lets a ``TypeError`` of a later renderer
through.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from trainmedic import jsonfile
from trainmedic.errors import RunDirectoryError
from trainmedic.findings.model import Category, Finding, FindingsDocument, Severity

MAX_FINDINGS_BYTES = 64 * 1024 * 1024
"""Largest findings document read, bytes (trainmedic's are a few KiB to a few MiB)."""


class _Shape(ValueError):
    """A field of the document has the wrong type or value."""


def read_findings_document(path: str | os.PathLike[str]) -> FindingsDocument:
    """The findings document in ``path``.

    Raises:
        RunDirectoryError: unreadable, too large, too deep, not JSON, or not
            a findings document (the message names the field).
    """
    shown = os.fsdecode(path)
    try:
        raw = jsonfile.read_limited(path, MAX_FINDINGS_BYTES)
        data = jsonfile.loads(raw, max_number=jsonfile.MAX_RECORD_NUMBER)
    except OSError as exc:
        raise RunDirectoryError(f"cannot read {shown}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise RunDirectoryError(f"{shown}: {jsonfile.describe(exc)}") from None
    try:
        return parse_findings_document(data)
    except _Shape as exc:
        raise RunDirectoryError(f"{shown}: malformed findings document: {exc}") from None


def parse_findings_document(data: Any) -> FindingsDocument:
    """A :class:`FindingsDocument` from parsed JSON; ``ValueError`` names the bad field."""
    if not isinstance(data, Mapping):
        raise _Shape(f"expected a JSON object, got {_kind(data)}")
    raw = data.get("findings")
    if not isinstance(raw, list):
        raise _Shape(f"findings: expected a list, got {_kind(raw)}")
    findings = tuple(_finding(f, f"findings[{i}]") for i, f in enumerate(raw))
    context = data.get("context")
    if context is not None and not isinstance(context, Mapping):
        raise _Shape(f"context: expected an object, got {_kind(context)}")
    created = data.get("created_at", 0.0)
    if not _number(created):
        raise _Shape(f"created_at: expected a number, got {_kind(created)}")
    tool = data.get("tool", "")
    if not isinstance(tool, str):
        raise _Shape(f"tool: expected a string, got {_kind(tool)}")
    return FindingsDocument(
        tool=tool, findings=findings, created_at=float(created), context=dict(context or {})
    )


def _finding(data: Any, where: str) -> Finding:
    if not isinstance(data, Mapping):
        raise _Shape(f"{where}: expected an object, got {_kind(data)}")
    for key in ("id", "title"):
        if not isinstance(data.get(key), str):
            raise _Shape(f"{where}.{key}: expected a string, got {_kind(data.get(key))}")
    for key in ("fix", "subject", "detail"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise _Shape(f"{where}.{key}: expected a string, got {_kind(value)}")
    evidence = data.get("evidence")
    if evidence is not None and not isinstance(evidence, Mapping):
        raise _Shape(f"{where}.evidence: expected an object, got {_kind(evidence)}")
    impact = data.get("impact")
    if impact is not None and not (_number(impact) and 0.0 <= float(impact) <= 1.0):
        raise _Shape(f"{where}.impact: expected a number within 0..1 or null, got {impact!r}")
    try:
        category = Category(data.get("category"))
        severity = Severity(data.get("severity"))
    except ValueError as exc:
        raise _Shape(f"{where}: {exc}") from None
    return Finding(
        id=data["id"],
        category=category,
        severity=severity,
        title=data["title"],
        evidence=dict(evidence or {}),
        fix=data.get("fix") or "",
        impact=None if impact is None else float(impact),
        subject=data.get("subject"),
        detail=data.get("detail"),
    )


def _number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= jsonfile.MAX_RECORD_NUMBER and math.isfinite(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)
