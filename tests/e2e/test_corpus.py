"""The validation corpus, one slow test per case: real training runs whose first finding
must name their known cause (tests/e2e/corpus.py; table in docs/diagnosis.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.readable import check_run_findings

from .corpus import BY_NAME, CASES, Outcome, run_case, servers

#: cases run by tests of their own in test_e2e_diagnosis.py
ELSEWHERE = frozenset({"manual-batches", "cpu-transform-w0", "healthy-compute"})


def check(outcome: Outcome) -> None:
    """Pass on a match; skip when others' load starved the loader; fail otherwise."""
    if outcome.result == "busy":
        pytest.skip(f"this machine is too busy to show {outcome.case.expected}: {outcome.got}")
    summary = [(f["id"], f["severity"], f["impact"]) for f in outcome.findings]
    detail = json.dumps(outcome.first, indent=1)[:3000] if outcome.first else outcome.stderr
    assert outcome.result == "match", f"{outcome.case.name}: {summary}\n{detail}"
    if outcome.run_dir is not None:  # read as a person would, at 80 and 120 columns
        meta = json.loads((outcome.run_dir / "meta.json").read_text())
        check_run_findings(outcome.findings, outcome.run_dir, meta["command"])


@pytest.mark.slow
@pytest.mark.parametrize("name", [c.name for c in CASES if c.name not in ELSEWHERE])
def test_the_first_finding_names_the_cause(tmp_path: Path, name: str) -> None:
    with servers(tmp_path) as env:
        check(run_case(BY_NAME[name], env))
