"""`trainmedic report RUN_DIR`: terminal summary, --json, --html, --trace, bad directories."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from trainmedic.cli.main import main
from trainmedic.findings.model import Category, Finding, FindingsDocument, Severity
from trainmedic.findings.schema import findings_schema
from trainmedic.record.store import RunRecordWriter
from trainmedic.record.types import RunMeta, StepRecord

T0 = 1_700_000_000.0


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def make_finding() -> Finding:
    return Finding(
        id="input.data_wait",
        category=Category.FRAMEWORK_CONFIG,
        severity=Severity.WARNING,
        title="The GPU waits for data 40% of each step",
        evidence={"data_wait_share": 0.4},
        fix="DataLoader(num_workers=6)",
        impact=0.4,
    )


def make_run(tmp_path: Path, with_findings: bool = True) -> Path:
    run_dir = tmp_path / "run"
    with RunRecordWriter(run_dir) as w:
        w.write_meta(
            RunMeta(
                run_id="run-42",
                command=("python", "train.py"),
                cwd=str(tmp_path),
                started_at=T0,
                ended_at=T0 + 90.0,
                exit_code=0,
            )
        )
        t = T0 + 1
        for i in range(300):
            t += 0.25
            w.add_step(
                StepRecord(i + 1, t, 0.25, data_wait_s=0.1, compute_s=0.1, samples=32, pid=9)
            )
    if with_findings:
        doc = FindingsDocument.build("run", [make_finding()], created_at=T0 + 91)
        (run_dir / "findings.json").write_text(json.dumps(doc.to_dict()))
    return run_dir


def test_terminal_report_shows_run_summary_and_findings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(capsys, "report", str(make_run(tmp_path)))
    assert code == 0, err
    assert "python train.py" in out
    assert "90.0 s" in out  # duration
    assert "exit code" in out
    assert "300 (" in out  # steps
    assert "4 steps/s" in out
    assert "128 samples/s" in out
    assert "40%" in out  # data wait share
    # Where a step's time goes, on top: 0.1 s waiting, 0.1 s in the step, 0.05 s other.
    assert "a step's time" in out.split("steps ")[0]
    # No DataLoader in this record: the wait is the loop's own time between steps.
    assert "▒ between steps 40%" in out and "█ forward/backward/optimizer 40%" in out
    assert "░ other host work 20%" in out
    assert "The GPU waits for data 40% of each step" in out
    assert "DataLoader(num_workers=6)" in out


def test_json_to_stdout_is_the_findings_document(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_cli(capsys, "report", str(make_run(tmp_path)), "--json")
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, findings_schema())
    assert [f["id"] for f in doc["findings"]] == ["input.data_wait"]


def test_missing_findings_are_diagnosed_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path, with_findings=False)
    code, out, _ = run_cli(capsys, "report", str(run_dir), "--json")
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, findings_schema())
    assert doc["context"]["rediagnosed"] is True
    assert doc["findings"]  # the diagnosis always gives at least a verdict
    assert not (run_dir / "findings.json").exists()  # reading never writes the run dir


def test_html_and_trace_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    html_path = tmp_path / "out" / "report.html"
    html_path.parent.mkdir()
    trace_path = tmp_path / "out" / "trace.json"
    json_path = tmp_path / "out" / "findings.json"
    code, out, err = run_cli(
        capsys,
        "report",
        str(make_run(tmp_path)),
        "--html",
        str(html_path),
        "--trace",
        str(trace_path),
        "--json",
        str(json_path),
    )
    assert code == 0, err
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "The GPU waits for data 40% of each step" in page
    events = json.loads(trace_path.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "step 1" for e in events)
    assert json.loads(json_path.read_text())["findings"][0]["id"] == "input.data_wait"
    assert f"html report written to {html_path}" in out
    assert "The GPU waits" in out  # the terminal report still printed


def test_json_on_stdout_keeps_other_messages_off_stdout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    html_path = tmp_path / "r.html"
    code, out, err = run_cli(
        capsys, "report", str(make_run(tmp_path)), "--json", "--html", str(html_path)
    )
    assert code == 0
    json.loads(out)
    assert f"html report written to {html_path}" in err


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "does not exist"),
        ("file", "is not a directory"),
        ("empty", "is not a run directory (no meta.json)"),
        ("bad_meta", "meta.json: malformed run metadata"),
        ("bad_findings", "findings.json: malformed findings document"),
        ("bad_line", "steps.jsonl:2: malformed record"),
    ],
)
def test_bad_run_dirs_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setup: str, message: str
) -> None:
    target = tmp_path / "target"
    if setup == "file":
        target.write_text("x")
    elif setup == "empty":
        target.mkdir()
    elif setup == "bad_meta":
        target.mkdir()
        (target / "meta.json").write_text("[1, 2")
    elif setup in ("bad_findings", "bad_line"):
        target = make_run(tmp_path)
        if setup == "bad_findings":
            (target / "findings.json").write_text('{"tool": "run"}')
        else:
            lines = (target / "steps.jsonl").read_text().splitlines(keepends=True)
            lines[1] = "garbage\n"
            (target / "steps.jsonl").write_text("".join(lines))
    code, out, err = run_cli(capsys, "report", str(target))
    assert code == 2
    assert out == ""
    assert err.startswith("trainmedic: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_refuses_to_overwrite_the_run_record(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    before = (run_dir / "steps.jsonl").read_bytes()
    code, _, err = run_cli(capsys, "report", str(run_dir), "--trace", str(run_dir / "steps.jsonl"))
    assert code == 2
    assert "would overwrite the run record's steps.jsonl" in err
    assert (run_dir / "steps.jsonl").read_bytes() == before
    # A report artifact next to the record is fine.
    code, _, err = run_cli(capsys, "report", str(run_dir), "--html", str(run_dir / "report.html"))
    assert code == 0, err
    assert (run_dir / "report.html").is_file()


def test_bad_output_paths_fail_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    code, _, err = run_cli(capsys, "report", str(run_dir), "--html", str(tmp_path / "no/x.html"))
    assert code == 2
    assert "does not exist" in err
    code, _, err = run_cli(capsys, "report", str(run_dir), "--html", str(tmp_path))
    assert code == 2
    assert "is a directory" in err
    same = str(tmp_path / "same.json")
    code, _, err = run_cli(capsys, "report", str(run_dir), "--json", same, "--trace", same)
    assert code == 2
    assert "name the same file" in err


def test_unrelated_runs_are_not_merged_as_one_jobs_nodes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    code, out, err = run_cli(capsys, "report", str(a), str(b))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{a} holds no distributed ranks" in err and "Traceback" not in err


def test_a_negative_step_time_in_a_hand_edited_record_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path, with_findings=False)
    steps = run_dir / "steps.jsonl"
    lines = steps.read_text().splitlines()
    first = json.loads(lines[0])
    first["d"] = -0.25
    steps.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    code, out, err = run_cli(capsys, "report", str(run_dir))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "steps.jsonl" in err and "duration_s must be a time of 0 s or more, not -0.25" in err
