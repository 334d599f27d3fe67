"""`trainmedic demo --scenario gpu-trace`: the bundled real GPU trace judged in seconds, with
no GPU and no torch; its findings where --out says, and wrong flags refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmedic.cli.main import main
from trainmedic.demo.traces import DEMO_TRACE


def test_the_bundled_trace_shows_communication_nothing_overlaps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--scenario", "gpu-trace", "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert "GPU busy 45% of each step" in stdout and "gpu.exposed_communication" in stdout
    assert "demo (gpu-trace): as expected" in stderr
    doc = json.loads((out / "findings.json").read_text())
    assert doc["findings"][0]["id"] == "gpu.exposed_communication"
    assert doc["context"]["trace"] == str(DEMO_TRACE)
    assert (out.stat().st_mode & 0o777) == 0o700


def test_its_licence_travels_with_it() -> None:
    notice = (DEMO_TRACE.parent / "NOTICE.md").read_text()
    assert DEMO_TRACE.name in notice and "MIT License" in notice


@pytest.mark.parametrize(
    ("extra", "says"),
    [(["--steps", "5"], "--steps is for training scenarios"),
     (["--out", "FILE"], "not a new or empty directory")],
)  # fmt: skip
def test_what_does_not_apply_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], says: str
) -> None:
    taken = tmp_path / "file"
    taken.write_text("mine")
    args = [str(taken) if a == "FILE" else a for a in extra]
    assert main(["demo", "--scenario", "gpu-trace", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert taken.read_text() == "mine"
