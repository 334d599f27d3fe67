"""`trainmedic compare RUN_A RUN_B`: terminal, --json, --html, and bad input in one line."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from trainmedic.cli.main import main
from trainmedic.findings.model import Category, Finding, FindingsDocument, Severity
from trainmedic.record.store import RunRecordWriter
from trainmedic.record.types import RunMeta, StepRecord

T0 = 1_700_000_000.0


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def make_run(path: Path, step_s: float, finding_ids: tuple[str, ...] = (), seed: int = 0) -> Path:
    rng = random.Random(seed)
    with RunRecordWriter(path) as w:
        w.write_meta(RunMeta(path.name, ("python", "train.py"), str(path.parent), T0, T0 + 60, 0))
        t = T0 + 1
        for i in range(300):
            d = step_s * rng.uniform(0.9, 1.1)
            t += d
            w.add_step(StepRecord(i + 1, t, d, data_wait_s=0.5 * d, compute_s=0.5 * d,
                                  samples=32, pid=9))  # fmt: skip
    findings = [
        Finding(i, Category.FRAMEWORK_CONFIG, Severity.WARNING, f"title {i}", {}, "fix", 0.4)
        for i in finding_ids
    ]
    doc = FindingsDocument.build("run", findings, created_at=T0 + 61)
    (path / "findings.json").write_text(json.dumps(doc.to_dict()))
    return path


def test_terminal_shows_verdict_measures_and_findings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = make_run(tmp_path / "before", 0.1, ("input.workers",))
    b = make_run(tmp_path / "after", 0.05, ("contention.cpu",), seed=1)
    code, out, err = run_cli(capsys, "compare", str(a), str(b))
    assert code == 0, err
    assert "faster: after/before throughput 2.0" in out
    assert "95% interval" in out
    assert "throughput (samples/s)" in out and "data wait (% of step)" in out
    assert "findings resolved: 1" in out and "input.workers" in out
    assert "findings new: 1" in out and "contention.cpu" in out


def test_json_to_stdout_and_html_to_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = make_run(tmp_path / "before", 0.1)
    b = make_run(tmp_path / "after", 0.1, seed=1)
    page = tmp_path / "compare.html"
    code, out, err = run_cli(capsys, "compare", str(a), str(b), "--json", "--html", str(page))
    assert code == 0, err
    doc = json.loads(out)
    # The same configuration twice: one pair cannot tell 3 % from run-to-run noise.
    assert doc["verdict"] == "inconclusive" and "runs a side" in doc["reasons"][0]
    lo, hi = doc["speedup_ci"]
    assert lo < 1.0 < hi and lo < doc["speedup"] < hi
    assert doc["before"]["run"] == "before" and doc["after"]["run"] == "after"
    assert f"html written to {page}" in err
    text = page.read_text()
    assert "inconclusive" in text and "Inconclusive because" in text and "Side by side" in text
    assert 'id="plot-0"' in text


def test_json_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a = make_run(tmp_path / "before", 0.1)
    b = make_run(tmp_path / "after", 0.2, seed=1)
    code, out, _ = run_cli(capsys, "compare", str(a), str(b), "--json", str(tmp_path / "c.json"))
    assert code == 0
    assert json.loads((tmp_path / "c.json").read_text())["verdict"] == "slower"
    assert "slower" in out


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "does not exist"),
        ("not_a_run", "is not a run directory"),
        ("corrupt_meta", "malformed run metadata"),
        ("corrupt_steps", "steps.jsonl"),
    ],
)
def test_bad_run_directories_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setup: str, message: str
) -> None:
    good = make_run(tmp_path / "good", 0.1)
    bad = tmp_path / "bad"
    if setup == "not_a_run":
        bad.mkdir()
        (bad / "notes.txt").write_text("hello")
    elif setup == "corrupt_meta":
        make_run(bad, 0.1)
        (bad / "meta.json").write_text("{not json")
    elif setup == "corrupt_steps":
        make_run(bad, 0.1)
        with (bad / "steps.jsonl").open("r+") as f:
            f.seek(0)
            f.write('{"s": "x"}\n')
    code, out, err = run_cli(capsys, "compare", str(good), str(bad))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("trainmedic: error: ") and message in err
    assert "Traceback" not in err


def test_outputs_never_go_into_a_run_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = make_run(tmp_path / "before", 0.1)
    b = make_run(tmp_path / "after", 0.1, seed=1)
    code, _, err = run_cli(capsys, "compare", str(a), str(b), "--html", str(a / "findings.json"))
    assert code == 2 and "would write into the run directory" in err
    before = (a / "findings.json").read_text()
    assert (a / "findings.json").read_text() == before
    # Nor into its subfolders, new file or old, with --force or without.
    attempt = b / "attempts" / "1" / "attempt.json"
    attempt.parent.mkdir(parents=True, exist_ok=True)
    attempt.write_text('{"mine": 1}')
    for target, extra in ((attempt, ["--force"]), (attempt.parent / "x.json", [])):
        code, _, err = run_cli(capsys, "compare", str(a), str(b), "--json", str(target), *extra)
        assert code == 2 and f"would write into the run directory {b}" in err, err
    assert attempt.read_text() == '{"mine": 1}' and not (attempt.parent / "x.json").exists()
    code, _, err = run_cli(
        capsys, "compare", str(a), str(b), "--html", str(tmp_path / "x" / "y.html")
    )
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(capsys, "compare", str(a))
    assert code == 2 and "give two run directories" in err


@pytest.mark.parametrize("separator", ["--", ":::"])
def test_repeated_runs_of_each_side(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, separator: str
) -> None:
    before = [str(make_run(tmp_path / f"a{i}", 0.1, seed=i)) for i in range(3)]
    after = [str(make_run(tmp_path / f"b{i}", 0.05, seed=10 + i)) for i in range(3)]
    code, out, err = run_cli(capsys, "compare", *before, separator, *after, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["verdict"] == "faster" and doc["speedup"] == pytest.approx(2.0, rel=0.05)
    assert [r["run"] for r in doc["runs"]["before"]] == ["a0", "a1", "a2"]
    assert [r["run"] for r in doc["runs"]["after"]] == ["b0", "b1", "b2"]
    # The run-to-run floor narrows with the runs: 1.96 * 0.12 * sqrt(2/3) in log a side.
    lo, hi = doc["speedup_ci"]
    floor = math.exp(1.96 * 0.12 * math.sqrt(2 / 3))
    assert hi / doc["speedup"] == pytest.approx(floor, abs=0.01)
    assert doc["speedup"] / lo == pytest.approx(floor, abs=0.01)
    code, out, _ = run_cli(capsys, "compare", *before, "--", *after)
    assert code == 0 and "before: a0, a1, a2" in out and "after:  b0, b1, b2" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a0"], "give two run directories"),
        (["a0", "a1", "b0"], "(3 given)"),
        (["a0", "--", "b0", ":::", "b1"], "one ::: (or --) between the two sides"),
        (["--", "b0"], "each side needs at least one run directory"),
        (["a0", "--", "a0"], "a0 is given more than once"),
    ],
)
def test_sides_given_wrongly_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    for name in ("a0", "a1", "b0", "b1"):
        make_run(tmp_path / name, 0.1)
    paths = [a if a in ("--", ":::") else str(tmp_path / a) for a in args]
    code, out, err = run_cli(capsys, "compare", *paths)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err


def test_the_run_noise_floor_is_the_users_to_set(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a = make_run(tmp_path / "before", 0.1)
    b = make_run(tmp_path / "after", 0.1, seed=1)
    code, out, _ = run_cli(capsys, "compare", str(a), str(b), "--json", "--run-noise", "0")
    assert code == 0 and json.loads(out)["run_noise"] == 0.0
    code, _, err = run_cli(capsys, "compare", str(a), str(b), "--run-noise", "2")
    assert code == 2 and "--run-noise" in err
