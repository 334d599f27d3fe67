"""A run's findings document: one shape for run, report and compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.builders import make_record, make_steps
from trainmedic.errors import RunDirectoryError
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.layout import FINDINGS_FILE
from trainmedic.report.run_findings import (
    diagnose_merged,
    load_or_diagnose,
    run_document,
)


def finding(severity: Severity, impact: float) -> Finding:
    return Finding(
        id=f"test.{severity.value}",
        category=Category.CPU,
        severity=severity,
        title="t",
        evidence={},
        fix="f",
        impact=impact,
    )


def test_the_document_carries_the_run_and_ranks_its_findings() -> None:
    record = make_record(make_steps(5))
    doc = run_document(
        record, [finding(Severity.INFO, 0.0), finding(Severity.ERROR, 0.5)], exit_code=3
    )
    assert doc.tool == "run"
    assert doc.context == {"run_id": "test-run", "command": ["python", "train.py"], "exit_code": 3}
    assert [f.severity for f in doc.findings] == [Severity.ERROR, Severity.INFO]
    text = doc.to_json()
    assert text.endswith("}\n")
    assert json.loads(text)["summary"] == {"error": 1, "warning": 0, "info": 1}


def test_a_written_document_is_read_back_as_it_was(tmp_path: Path) -> None:
    record = make_record(make_steps(5))
    doc = run_document(record, [finding(Severity.WARNING, 0.2)], run_dir="x")
    (tmp_path / FINDINGS_FILE).write_text(doc.to_json())
    back = load_or_diagnose(tmp_path, record)
    assert back.to_dict() == doc.to_dict()


def test_a_run_without_findings_is_diagnosed_again(tmp_path: Path) -> None:
    record = make_record(make_steps(50))
    doc = load_or_diagnose(tmp_path, record)
    assert doc.context["rediagnosed"] is True
    assert doc.context["run_id"] == "test-run"
    assert doc.findings  # at least the overall verdict


def test_a_damaged_findings_file_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / FINDINGS_FILE).write_text("{not json")
    with pytest.raises(RunDirectoryError, match=FINDINGS_FILE):
        load_or_diagnose(tmp_path, make_record(make_steps(5)))


def test_merged_runs_say_so_and_name_their_nodes() -> None:
    record = make_record(make_steps(20))
    record.meta.environment["nodes"] = ["a", "b"]
    doc = diagnose_merged(record)
    assert doc.context["merged"] is True and doc.context["nodes"] == ["a", "b"]
