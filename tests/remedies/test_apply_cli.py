"""``run --apply-from`` refuses bad sources before anything runs; the report lists the changes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from trainmedic.cli.main import main
from trainmedic.record.types import RunEvent, RunMeta, RunRecord
from trainmedic.report.applied import applied_changes, render_applied


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--apply-from", "missing-dir"], "no such run directory or tuning file"),
        (["--apply-from", "."], "not a trainmedic run directory"),
        (["--no-probe", "--apply-from", "."], "--apply-from needs the probe"),
    ],
)
def test_bad_sources_are_one_line_usage_errors_and_nothing_runs(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--out", "run", *args, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().count("\n") == 0 and message in err
    assert not (tmp_path / "run").exists()


def record(*events: RunEvent) -> RunRecord:
    return RunRecord(meta=RunMeta("r", ("python",), "/", 0.0), events=list(events))


def test_changes_are_listed_once_with_the_processes_that_made_them() -> None:
    applied = "DataLoader num_workers 0 -> 2 (--apply-from)"
    rec = record(
        RunEvent(1.0, "remedy_applied", applied, pid=1),
        RunEvent(1.0, "remedy_applied", applied, pid=2),
        RunEvent(2.0, "remedy_reverted", "DataLoader 2 back to the script's settings", pid=1),
        RunEvent(2.0, "remedy", "restart remedy, not ours", pid=1),
    )
    changes = applied_changes(rec)
    assert [(c.kind, c.processes) for c in changes] == [
        ("remedy_applied", 2),
        ("remedy_reverted", 1),
    ]
    out = io.StringIO()
    render_applied(Console(file=out, width=120), rec, "prev")
    text = out.getvalue()
    assert "applied fixes (--apply-from prev)" in text
    assert f"✓ {applied} (2 processes)" in text and "↺ DataLoader 2 back" in text


def test_a_plan_that_changed_nothing_says_so_and_no_plan_prints_nothing() -> None:
    out = io.StringIO()
    render_applied(Console(file=out, width=120), record(), "prev")
    assert "nothing was changed in the job" in out.getvalue()
    out = io.StringIO()
    render_applied(Console(file=out, width=120), record(), None)
    assert out.getvalue() == ""


def test_a_plan_that_changed_nothing_says_why() -> None:
    def said(plan: dict[str, object]) -> str:
        out = io.StringIO()
        render_applied(Console(file=out, width=300), record(), "prev", plan)
        return out.getvalue()

    empty = {"dataloader": {}, "switches": {}, "reasons": {
        "dataloader": "nothing to change: no finding of the run recommends loader settings"}}
    assert "the plan had nothing to apply (dataloader: nothing to change: no finding" in said(empty)
    loader = {"dataloader": {"num_workers": 2}, "switches": {}, "dataset_types": ["data.Images"]}
    assert "no DataLoader over data.Images was made" in said(loader)
    both = {"dataloader": {"num_workers": 2}, "switches": {"tf32_matmul": True}}
    text = said(both)
    assert "over a map-style dataset was made and torch was not imported with CUDA" in text
