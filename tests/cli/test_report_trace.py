"""`trainmedic report TRACE.json.gz`: a torch.profiler trace judged, its summary and the
findings document; what is not a trace, or a trace without steps, is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from trainmedic.cli.main import main
from trainmedic.findings.schema import findings_schema

TRACES = Path(__file__).resolve().parents[1] / "traces" / "data"
SAMPLED = TRACES / "sampled-rank0.json.gz"
NO_STEPS = TRACES / "a100-alexnet.json.gz"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_trace_gets_its_summary_and_findings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "report", str(SAMPLED))
    assert code == 0
    assert "sampled-rank0.json.gz: 2 steps, median 615.1 ms" in out
    assert "GPU busy 45% of each step" in out and "rank 0 of 128" in out
    assert "gpu.exposed_communication" in out


def test_json_carries_the_context_and_validates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_file = tmp_path / "findings.json"
    code, _, _ = run_cli(capsys, "report", str(SAMPLED), "--json", str(out_file))
    assert code == 0
    doc = json.loads(out_file.read_text())
    jsonschema.validate(doc, findings_schema())
    ctx = doc["context"]
    assert ctx["steps"] == 2 and ctx["gpu_busy_share"] == pytest.approx(0.445, abs=0.001)
    assert ctx["step_time_median_s"] == pytest.approx(0.61512)
    assert (ctx["rank"], ctx["world_size"]) == (0, 128)
    assert doc["findings"][0]["id"] == "gpu.exposed_communication"
    code, out, _ = run_cli(capsys, "report", str(SAMPLED), "--json", "-")
    assert code == 0 and json.loads(out)["context"]["steps"] == 2


def test_several_traces_are_each_judged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other = tmp_path / "rank1.json.gz"
    shutil.copy(SAMPLED, other)
    code, out, _ = run_cli(capsys, "report", str(SAMPLED), str(other), "--json", "-")
    doc = json.loads(out)
    assert code == 0 and [t["trace"] for t in doc["context"]["traces"]] == [
        str(SAMPLED), str(other)]  # fmt: skip


def test_a_trace_without_steps_says_what_it_holds(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "report", str(NO_STEPS))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "no ProfilerStep#N spans (1408 events, 79 kernels on NVIDIA A100" in line
    assert "prof.step()" in line


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"\x1f\x8b\x08\x00garbage", "truncated or corrupt"), (b"{]", "not valid JSON"),
     (b'{"traceEvents": []}', "another tool")],
)  # fmt: skip
def test_what_is_not_a_trace_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, says: str
) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(content)
    code, out, err = run_cli(capsys, "report", str(bad))
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert says in line and "Traceback" not in err


def test_outputs_never_replace_the_trace_and_html_is_for_run_directories(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mine = tmp_path / "mine.json.gz"
    shutil.copy(SAMPLED, mine)
    before = mine.read_bytes()
    code, _, err = run_cli(capsys, "report", str(mine), "--json", str(mine), "--force")
    assert code == 2 and "is one of the traces read" in err and mine.read_bytes() == before
    code, _, err = run_cli(capsys, "report", str(mine), "--html", str(tmp_path / "r.html"))
    assert code == 2 and "--html is for run directories" in err
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code, _, err = run_cli(capsys, "report", str(mine), str(run_dir))
    assert code == 2 and "not both" in err
