"""The shared finding model and its JSON schema."""

from trainmedic.findings.model import (
    SCHEMA_VERSION,
    Category,
    Finding,
    FindingsDocument,
    Severity,
    rank_findings,
    worst_severity,
)

__all__ = [
    "SCHEMA_VERSION",
    "Category",
    "Finding",
    "FindingsDocument",
    "Severity",
    "rank_findings",
    "worst_severity",
]
