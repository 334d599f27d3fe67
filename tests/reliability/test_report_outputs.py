"""``trainmedic report`` never overwrites a file it did not create for that purpose."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from trainmedic.cli.main import main
from trainmedic.findings.model import FindingsDocument
from trainmedic.record.store import RunRecordWriter
from trainmedic.record.types import RunMeta, StepRecord

T0 = 1_700_000_000.0
CHECKPOINT = b"\x80\x02 a checkpoint the Checkpointer needs"


def make_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    with RunRecordWriter(run_dir) as w:
        w.write_meta(
            RunMeta(run_id="r", command=("python", "t.py"), cwd="/", started_at=T0, exit_code=0)
        )
        for i in range(20):
            w.add_step(StepRecord(i + 1, T0 + 1 + i * 0.1, 0.1, pid=7))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "ckpt-000001-step10.pt").write_bytes(CHECKPOINT)
    (run_dir / "stdout.log").write_bytes(b"the job's output\n")
    (run_dir / "attempts" / "1").mkdir(parents=True)
    (run_dir / "attempts" / "1" / "attempt.json").write_text('{"number": 1}\n')
    doc = FindingsDocument.build("run", [], created_at=T0)
    (run_dir / "findings.json").write_text(json.dumps(doc.to_dict()))
    return run_dir


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["report", *args])
    _, err = capsys.readouterr()
    return code, err


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize(
    ("flag", "target"),
    [
        ("--json", "checkpoints/ckpt-000001-step10.pt"),
        ("--json", "stdout.log"),
        ("--html", "attempts/1/attempt.json"),
        ("--trace", "meta.json"),
        ("--html", "findings.json"),
        ("--json", "checkpoints/new-name.json"),
    ],
)
def test_no_file_inside_the_run_directory_is_overwritten(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, target: str
) -> None:
    run_dir = make_run(tmp_path)
    before = snapshot(run_dir)
    code, err = report(capsys, str(run_dir), flag, str(run_dir / target))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("trainmedic: error: "), err
    assert "run directory" in err
    assert snapshot(run_dir) == before


def test_a_symlink_into_the_run_directory_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    link = tmp_path / "innocent.json"
    link.symlink_to(run_dir / "checkpoints" / "ckpt-000001-step10.pt")
    code, err = report(capsys, str(run_dir), "--json", str(link))
    assert code == 2, err
    assert (run_dir / "checkpoints" / "ckpt-000001-step10.pt").read_bytes() == CHECKPOINT
    assert link.is_symlink()


def test_a_new_file_at_the_top_of_the_run_directory_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    code, err = report(capsys, str(run_dir), "--trace", str(run_dir / "trace.json"))
    assert code == 0, err
    assert json.loads((run_dir / "trace.json").read_text())["traceEvents"]


def test_an_existing_file_outside_needs_force(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    mine = tmp_path / "notes.html"
    mine.write_text("my notes")
    code, err = report(capsys, str(run_dir), "--html", str(mine))
    assert code == 2
    assert "--force" in err
    assert mine.read_text() == "my notes"
    code, err = report(capsys, str(run_dir), "--html", str(mine), "--force")
    assert code == 0, err
    assert "<html" in mine.read_text()


def test_its_own_earlier_outputs_are_replaced_without_force(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    outs = [tmp_path / "f.json", tmp_path / "r.html", tmp_path / "t.json"]
    args = ["--json", str(outs[0]), "--html", str(outs[1]), "--trace", str(outs[2])]
    assert report(capsys, str(run_dir), *args)[0] == 0
    first = [p.stat().st_mtime_ns for p in outs]
    for p in outs:
        os.utime(p, ns=(0, 0))
    code, err = report(capsys, str(run_dir), *args)
    assert code == 0, err
    assert all(p.stat().st_mtime_ns > 0 for p in outs), first


def test_a_device_is_written_into_not_replaced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A private copy of /dev/null: a product that replaced its output would
    # replace this node, never the machine's /dev/null.
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    run_dir = make_run(tmp_path)
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    code, err = report(capsys, str(run_dir), "--html", str(null))
    assert code == 0, err
    assert stat.S_ISCHR(null.stat().st_mode)


def test_a_fifo_is_written_into_not_replaced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = bytearray()

    def drain() -> None:
        with open(fifo, "rb") as f:
            received.extend(f.read())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    code, err = report(capsys, str(run_dir), "--json", str(fifo))
    reader.join(10)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert json.loads(bytes(received))["tool"] == "run"


def test_an_output_in_a_missing_directory_or_a_directory_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    for target in (tmp_path / "nope" / "x.json", tmp_path):
        code, err = report(capsys, str(run_dir), "--json", str(target))
        assert code == 2
        assert err.count("\n") == 1, err
