"""A run's findings document: made, read back and rendered one way for every command.

``trainmedic run`` diagnoses the closed record at the end of the job and
writes the document to the run directory (:data:`~trainmedic.record.layout.FINDINGS_FILE`);
``trainmedic report`` and ``trainmedic compare`` read it back, or diagnose the
record again when the run has none (a killed supervisor, an older record).
Every document of a run carries the run's id and command in its context, and
is written as the same JSON text wherever it goes (:meth:`FindingsDocument.to_json`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainmedic.errors import RunDirectoryError
from trainmedic.findings.model import Finding, FindingsDocument
from trainmedic.ostext import printable
from trainmedic.record.layout import FINDINGS_FILE
from trainmedic.record.types import RunRecord


def run_document(
    record: RunRecord, findings: Iterable[Finding], **context: Any
) -> FindingsDocument:
    """The findings document of ``record``: ``findings`` ranked, with the run's id
    and command and ``context`` (what the command adds: exit code, run directory,
    ``rediagnosed``, ...) in its context."""
    return FindingsDocument.build(
        "run",
        findings,
        created_at=time.time(),
        context={
            "run_id": record.meta.run_id,
            "command": list(record.meta.command),
            **context,
        },
    )


def load_or_diagnose(run_dir: Path, record: RunRecord) -> FindingsDocument:
    """The run's findings: its ``findings.json``, else a fresh diagnosis of ``record``.

    Raises:
        RunDirectoryError: the run directory or its ``findings.json`` cannot be read.
    """
    from trainmedic.diagnose import diagnose_stored
    from trainmedic.findings.reading import read_findings_document

    path = run_dir / FINDINGS_FILE
    try:
        present = path.is_file()
    except OSError as exc:
        raise RunDirectoryError(f"cannot read {printable(str(path))}: {exc.strerror}") from None
    if present:
        return read_findings_document(path)
    return run_document(record, diagnose_stored(record, run_dir), rediagnosed=True)


def diagnose_merged(record: RunRecord) -> FindingsDocument:
    """The findings of several nodes' runs merged into one record."""
    from trainmedic.diagnose import diagnose_run

    nodes = record.meta.environment.get("nodes") or []
    return run_document(record, diagnose_run(record), merged=True, nodes=nodes)
