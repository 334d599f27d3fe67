"""Bad input: one line naming what is wrong, a non-zero exit, nothing created, nothing lost."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from trainmedic.cli.main import main
from trainmedic.errors import UsageError
from trainmedic.record.store import RunRecordWriter
from trainmedic.record.types import RunMeta
from trainmedic.supervise.loop.resume import parse_resume_template

from .helpers import (
    assert_one_line_error,
    can_drop_read_permission,
    listing,
    python_job,
    trainmedic,
)

LONG = "a" * 300  # one path component over NAME_MAX (255 bytes)
DEEP = "[" * 100_000 + "]" * 100_000


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    _, err = capsys.readouterr()
    return code, err


def assert_one_line(code: int, err: str, expected: int = 2) -> str:
    assert code == expected, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainmedic: error: "), err
    return lines[0]


def make_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    with RunRecordWriter(run_dir) as w:
        w.write_meta(RunMeta(run_id="r", command=("t",), cwd="/", started_at=1.0, exit_code=0))
    return run_dir


# --- non-UTF-8 bytes -------------------------------------------------------------------------


def test_non_utf8_arguments_reach_the_job_byte_exact(tmp_path: Path) -> None:
    raw = b"\xff\xfe caf\xe9"
    code = "import os, sys; sys.stdout.buffer.write(os.fsencode(sys.argv[1]))"
    job = python_job(code, raw)
    got = trainmedic("run", "-q", "--no-html", "--out", tmp_path / "run", "--", *job)
    assert got.returncode == 0, got.stderr
    assert got.stdout == raw
    meta = json.loads((tmp_path / "run" / "meta.json").read_text(encoding="utf-8"))
    assert meta["command"][-1] == "\\xff\\xfe caf\\xe9"  # shown escaped, never garbled


def test_a_non_utf8_out_directory_works_and_does_not_block_a_rerun(tmp_path: Path) -> None:
    out = os.fsencode(tmp_path) + b"/run-\xff"
    got = trainmedic("run", "-q", "--out", out, "--", *python_job("print('ok')"))
    assert got.returncode == 0, got.stderr
    assert b"Traceback" not in got.stderr
    assert os.path.isfile(out + b"/meta.json") and os.path.isfile(out + b"/report.html")
    second = trainmedic("report", out)
    assert second.returncode == 0, second.stderr
    again = trainmedic("run", "-q", "--out", out + b"-2", "--", *python_job("print('ok')"))
    assert again.returncode == 0, again.stderr


# --- names too long ------------------------------------------------------------------------


def test_a_name_too_long_is_one_line_everywhere(tmp_path: Path) -> None:
    got = trainmedic("run", "--out", tmp_path / LONG, "--", *python_job("pass"))
    assert "name too long" in assert_one_line_error(got)
    assert listing(tmp_path) == []
    got = trainmedic("report", tmp_path / LONG)
    assert "name too long" in assert_one_line_error(got)
    got = trainmedic("run", "--out", tmp_path / "run", "--", LONG)
    assert_one_line_error(got, code=127)
    assert listing(tmp_path) == []


# --- doctor --------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://[::1", "http://host:99999", "http://", "ftp://x"])
def test_a_bad_data_url_is_one_line(capsys: pytest.CaptureFixture[str], url: str) -> None:
    assert_one_line(*cli(capsys, "doctor", "--data-url", url))


def test_simulate_dev_zero_fails_fast(tmp_path: Path) -> None:
    start = time.monotonic()
    got = trainmedic("doctor", "--simulate", "/dev/zero", timeout=60)
    line = assert_one_line_error(got)
    assert "larger than" in line
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(
    ("content", "expected"),
    [("[1, 2]", "JSON object"), (DEEP, "nested"), ("{", "not valid JSON"), ("\xff", "")],
)
def test_a_malformed_simulation_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "sim.json"
    path.write_bytes(content.encode("latin-1"))
    line = assert_one_line(*cli(capsys, "doctor", "--simulate", str(path)))
    assert expected in line


# --- report -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [("[1, 2]", "JSON object"), (DEEP, "nested"), ('{"findings": [1]}', "findings")],
)
def test_a_malformed_findings_document_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, expected: str
) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "findings.json").write_text(content)
    line = assert_one_line(*cli(capsys, "report", str(run_dir)))
    assert expected in line


def test_a_deeply_nested_run_record_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "meta.json").write_text(DEEP)
    assert_one_line(*cli(capsys, "report", str(run_dir)))
    run_dir = make_run(tmp_path / "b")
    (run_dir / "events.jsonl").write_text(DEEP + "\n{}\n")
    assert_one_line(*cli(capsys, "report", str(run_dir)))


def test_an_oversized_findings_document_is_refused_before_reading(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = make_run(tmp_path)
    with open(run_dir / "findings.json", "wb") as f:
        f.truncate(4 * 1024**3)  # sparse: 4 GiB that cost nothing to make
    line = assert_one_line(*cli(capsys, "report", str(run_dir)))
    assert "larger than" in line


@pytest.mark.parametrize("what", ["directory", "meta"])
def test_a_run_directory_it_may_not_read_is_one_line(tmp_path: Path, what: str) -> None:
    prefix = can_drop_read_permission()
    if prefix is None:
        pytest.skip("running as root without setpriv: file modes do not apply")
    run_dir = make_run(tmp_path)
    target = run_dir if what == "directory" else run_dir / "meta.json"
    os.chmod(target, 0)
    try:
        got = subprocess.run(
            [*prefix, sys.executable, "-m", "trainmedic", "report", str(run_dir / ".")],
            capture_output=True,
            timeout=60,
            check=False,
        )
        line = assert_one_line_error(got)
        assert "ermission denied" in line
    finally:
        os.chmod(target, 0o700)


# --- checkpoints -----------------------------------------------------------------------------


def test_a_deeply_nested_checkpoint_manifest_is_skipped(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from trainmedic.checkpoint import Checkpointer, CheckpointWarning

    ckpt = Checkpointer(tmp_path)
    ckpt.save(1)
    ckpt.save(2)
    newest = ckpt.checkpoints()[0]
    newest.manifest.write_text(DEEP)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Checkpointer(tmp_path).load(rng=False) == 1
    assert any(issubclass(w.category, CheckpointWarning) for w in caught)


# --- run options -----------------------------------------------------------------------------


def test_an_unknown_option_before_the_command_is_a_usage_error(tmp_path: Path) -> None:
    got = trainmedic("run", "--quite", "--", *python_job("pass"), cwd=tmp_path)
    line = assert_one_line_error(got)
    assert "did you mean --quiet?" in line
    assert listing(tmp_path) == []


def test_options_after_the_command_are_the_job_s(tmp_path: Path) -> None:
    code = "import sys; print(sys.argv[1:])"
    got = trainmedic("run", "-q", "--no-html", *python_job(code, "--quiet", "--"), cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"['--quiet', '--']\n"


@pytest.mark.parametrize(
    "template", ["{checkpoint", "{step!z}", "--from {nope}", "{step:>5}", "x}", "{}", "{0}"]
)
def test_a_malformed_resume_template_is_refused(tmp_path: Path, template: str) -> None:
    with pytest.raises(UsageError):
        parse_resume_template(template)
    got = trainmedic("run", "--resume-args", template, "--", *python_job("pass"), cwd=tmp_path)
    assert_one_line_error(got)
    assert listing(tmp_path) == []


def test_braces_are_escaped_by_doubling_them() -> None:
    from trainmedic.supervise.loop.resume import ResumePoint, resume_arguments

    template = parse_resume_template("--cfg={{a:{step}}} {checkpoint}")
    args = resume_arguments(template, ResumePoint(Path("/c.pt"), 3, "glob"))
    assert args == ["--cfg={a:3}", "/c.pt"]


def test_an_existing_empty_out_directory_keeps_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o755)
    got = trainmedic("run", "-q", "--no-html", "--out", out, "--", *python_job("pass"))
    assert got.returncode == 0, got.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert b"readable by others" in got.stderr
    for p in out.rglob("*"):
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode & 0o077 == 0, (p, oct(mode))


def test_out_pointing_at_a_file_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("mine")
    got = trainmedic("run", "--out", target, "--", *python_job("pass"))
    assert_one_line_error(got)
    assert target.read_text() == "mine"


def test_out_as_a_dangling_symlink_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    got = trainmedic("run", "--out", tmp_path / "link", "--", *python_job("pass"))
    assert "does not exist" in assert_one_line_error(got)
    assert listing(tmp_path) == ["link"]


def test_an_empty_run_dir_for_report_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert "empty" in assert_one_line(*cli(capsys, "report", ""))


def test_a_fifo_output_nobody_reads_fails_instead_of_waiting(tmp_path: Path) -> None:
    from trainmedic.cli.outputs import _open_stream

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="nothing read from the FIFO"):
        _open_stream(fifo, wait_s=0.1)


@pytest.mark.parametrize("option", ["--backoff", "--grace", "--timeout", "--time-budget"])
def test_a_duration_past_a_year_is_a_usage_error(tmp_path: Path, option: str) -> None:
    # 1e300 s overflowed the backoff's timer after the first attempt.
    got = trainmedic("run", option, "1e300", "--", *python_job("pass"), cwd=tmp_path)
    assert "at most" in assert_one_line_error(got)
    assert listing(tmp_path) == []


def test_a_removed_current_directory_is_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    argv = [sys.executable, "-m", "trainmedic", "run", "--out", str(tmp_path / "run"), "--"]
    got = subprocess.run(
        [*argv, *python_job("pass")],
        cwd=gone,
        preexec_fn=lambda: os.rmdir(gone),  # the shell's directory removed under it
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert "current directory" in assert_one_line_error(got)
    assert listing(tmp_path) == []
