"""The full findings documents of the canonical records, pinned as golden JSON.

After an intended change, rewrite them with
``TRAINMEDIC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/diagnose/test_golden.py`` and
review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from trainmedic.diagnose import diagnose_run
from trainmedic.findings.model import FindingsDocument
from trainmedic.findings.schema import findings_schema

from .canonical import CANONICAL

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("TRAINMEDIC_UPDATE_GOLDEN") == "1"


def document(name: str) -> dict[str, Any]:
    findings = diagnose_run(CANONICAL[name](), strict=True)  # consistent, or it raises
    doc = FindingsDocument.build("run", findings, created_at=0.0, context={"record": name})
    # through JSON, as a reader of the file sees it
    data: dict[str, Any] = json.loads(json.dumps(doc.to_dict()))
    return data


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_findings_match_golden(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    actual = document(name)
    if UPDATE:
        path.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert path.exists(), f"missing {path}: run with TRAINMEDIC_UPDATE_GOLDEN=1"
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert actual == expected


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_golden_documents_follow_the_schema(name: str) -> None:
    import jsonschema

    jsonschema.validate(document(name), findings_schema())
