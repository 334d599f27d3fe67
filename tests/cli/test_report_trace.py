"""`trainmedic report TRACE.json.gz`: a torch.profiler trace judged, its summary and the
findings document; what is not a trace, or a trace without steps, is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from tests.traces.events import item_each_step, x

from trainmedic.cli.main import main
from trainmedic.demo.traces import DEMO_TRACE
from trainmedic.findings.schema import findings_schema

TRACES = Path(__file__).resolve().parents[1] / "traces" / "data"
SAMPLED = DEMO_TRACE
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


def test_outputs_never_replace_the_trace_and_chrome_export_is_for_run_directories(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mine = tmp_path / "mine.json.gz"
    shutil.copy(SAMPLED, mine)
    before = mine.read_bytes()
    code, _, err = run_cli(capsys, "report", str(mine), "--json", str(mine), "--force")
    assert code == 2 and "is one of the traces read" in err and mine.read_bytes() == before
    code, _, err = run_cli(capsys, "report", str(mine), "--html", str(mine), "--force")
    assert code == 2 and "--html" in err and "is one of the traces read" in err
    assert mine.read_bytes() == before
    code, _, err = run_cli(capsys, "report", str(mine), "--trace", str(tmp_path / "t.json"))
    assert code == 2 and "--trace is for run directories" in err
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code, _, err = run_cli(capsys, "report", str(mine), str(run_dir))
    assert code == 2 and "not both" in err


def _write(path: Path, events: list[dict[str, Any]], **header: Any) -> Path:
    path.write_text(json.dumps({**header, "traceEvents": events}))
    return path


def test_a_sync_each_step_is_named_at_its_call_site(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _write(tmp_path / "t.json", item_each_step())
    code, out, _ = run_cli(capsys, "report", str(path), "--json", "-")
    doc = json.loads(out)
    jsonschema.validate(doc, findings_schema())
    first = doc["findings"][0]
    # 150 µs of the GPU's 1 ms step idle after each .item(): 15 %.
    assert code == 0 and first["id"] == "gpu.host_sync" and first["impact"] == pytest.approx(0.15)
    assert "Tensor.item in train.py(30): train_step" in first["title"]
    assert first["evidence"]["sync_sites"][0]["count"] == 3


def test_one_jobs_ranks_are_compared(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def rank_trace(r: int, kernel_us: float) -> Path:
        events = []
        for n in range(4):
            t = 10_000 * n
            events += [
                x("user_annotation", f"ProfilerStep#{n}", t, 10_000),
                x("kernel", "gemm", t + 100, kernel_us, device=0),
                x("kernel", "ncclKernel_AllReduce_RING", t + 100 + kernel_us,
                  9_500 - kernel_us, device=0),
            ]  # fmt: skip
        return _write(tmp_path / f"r{r}.json", events,
                      distributedInfo={"rank": r, "world_size": 2, "backend": "nccl"})  # fmt: skip

    r0, r1 = rank_trace(0, 5_000), rank_trace(1, 8_000)
    code, out, _ = run_cli(capsys, "report", str(r0), str(r1), "--json", "-")
    doc = json.loads(out)
    assert code == 0 and doc["findings"][0]["id"] == "distributed.gpu_imbalance"
    assert doc["findings"][0]["subject"] == "rank1"
    assert doc["findings"][0]["impact"] == pytest.approx(0.3)
    assert [r["rank"] for r in doc["context"]["ranks"]] == [0, 1]
    assert doc["context"]["ranks"][1]["gpu_compute_ms"] == pytest.approx(8.0)
    # Rank 0's NCCL alone on its GPU is mostly that wait: information pointing at rank 1,
    # not advice on bucket sizes.
    waits = [f for f in doc["findings"] if f["id"] == "gpu.exposed_communication"
             and f["evidence"].get("rank") == 0]  # fmt: skip
    assert len(waits) == 1 and waits[0]["severity"] == "info"
    assert "wait for rank 1" in waits[0]["title"] and "bucket" not in waits[0]["fix"]


def test_html_splits_each_step_into_what_the_gpu_did_and_why_it_idled(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from trainmedic.report.trace_html import step_parts_ms
    from trainmedic.traces.kineto import read_trace

    path = _write(tmp_path / "t<b>.json", item_each_step())
    page_path = tmp_path / "r.html"
    code, out, _ = run_cli(capsys, "report", str(path), "--html", str(page_path))
    assert code == 0 and "html report written" in out
    page = page_path.read_text()
    assert "gpu.host_sync" in page and "idle after syncs" in page
    assert "<code>t&lt;b&gt;.json</code>" in page and "t<b>.json" not in page  # escaped
    # The parts of a step add up to it: 600 µs of GPU work, 150 µs idle after the sync,
    # the rest of the 1 ms idle with no reason the trace shows.
    step = read_trace(path).steps[0]
    parts = step_parts_ms(step)
    assert parts == pytest.approx((0.6, 0.0, 0.15, 0.0, 0.25))
    assert sum(parts) == pytest.approx(step.dur_us / 1000)
    # Its own earlier page is replaced; a file of the user's is not, without --force.
    assert run_cli(capsys, "report", str(path), "--html", str(page_path))[0] == 0
    notes = tmp_path / "notes.html"
    notes.write_text("<p>mine</p>")
    code, _, err = run_cli(capsys, "report", str(path), "--html", str(notes))
    assert code == 2 and "Traceback" not in err and notes.read_text() == "<p>mine</p>"


def test_a_trace_given_twice_and_html_to_stdout_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(capsys, "report", str(SAMPLED), str(SAMPLED))
    assert code == 2 and "is given twice" in err and out == ""
    code, out, err = run_cli(capsys, "report", str(SAMPLED), "--html", "-")
    (line,) = err.strip().splitlines()
    assert code == 2 and "only --json writes to standard output" in line and out == ""
