"""``trainmedic run`` end to end: the job behaves as without trainmedic, and the run is recorded."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from trainmedic.findings.schema import findings_schema

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TRAINMEDIC = [sys.executable, "-m", "trainmedic", "run"]


def script(name: str, *args: object) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *(str(a) for a in args)]


def trainmedic(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*TRAINMEDIC, *args], capture_output=True, timeout=timeout, check=False)


def plain(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=60, check=False)


@pytest.mark.parametrize("code", [0, 3])
def test_output_and_exit_code_pass_through_unchanged(tmp_path: Path, code: int) -> None:
    run_dir = tmp_path / "run"
    job = script("passthrough.py", code)
    expected = plain(job)
    got = trainmedic("--quiet", "--no-html", "--out", str(run_dir), "--", *job)
    assert got.returncode == expected.returncode == code
    assert got.stdout == expected.stdout  # byte for byte: \r, partial lines, raw bytes
    assert got.stderr.startswith(expected.stderr)  # trainmedic's summary comes after
    assert (run_dir / "stdout.log").read_bytes() == expected.stdout
    assert (run_dir / "stderr.log").read_bytes() == expected.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["exit_code"] == code
    assert meta["command"] == job


def test_a_job_killed_by_a_signal_exits_like_a_shell_says(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    got = trainmedic(
        "--quiet",
        "--no-html",
        "--max-restarts",
        "0",  # a SIGKILL from outside is restarted by default; here only the status matters
        "--out",
        str(tmp_path / "run"),
        "--",
        sys.executable,
        "-c",
        code,
    )
    assert got.returncode == 128 + signal.SIGKILL
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["exit_code"] == -signal.SIGKILL


def test_a_missing_command_is_one_line_and_exit_127(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    got = trainmedic("--out", str(run_dir), "--", "no-such-trainer-xyz", "--lr", "3")
    assert got.returncode == 127
    assert got.stderr == b"trainmedic: error: command not found: no-such-trainer-xyz\n"
    assert got.stdout == b""
    assert not run_dir.exists()  # nothing left behind for a typo


def test_a_run_directory_with_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    got = trainmedic("--out", str(tmp_path), "--", sys.executable, "-c", "print(1)")
    assert got.returncode == 2
    assert got.stderr.count(b"\n") == 1 and b"not empty" in got.stderr
    assert got.stdout == b""  # the job never ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_no_command_is_a_usage_error() -> None:
    got = trainmedic("--quiet")
    assert got.returncode == 2
    assert b"no command given" in got.stderr


def test_the_run_directory_holds_a_valid_findings_document(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    got = trainmedic("--quiet", "--out", str(run_dir), "--", *script("api_phases.py", 8, 0.01))
    assert got.returncode == 0, got.stderr.decode()
    document = json.loads((run_dir / "findings.json").read_text())
    jsonschema.validate(document, findings_schema())
    assert document["tool"] == "run"
    assert document["context"]["run_id"] == "run"
    assert (run_dir / "report.html").stat().st_size > 0
    for name in ("findings.json", "report.html", "meta.json", "steps.jsonl", "stdout.log"):
        assert (run_dir / name).stat().st_mode & 0o777 == 0o600, name
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert not (run_dir / "probe.sock").exists()
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert len([s for s in steps if s.get("ph", "train") == "train"]) == 8
    assert f"report: {run_dir / 'report.html'}".encode() in got.stderr


def test_ctrl_c_reaches_the_job_and_its_exit_code_comes_back(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            *TRAINMEDIC,
            "--quiet",
            "--no-html",
            "--out",
            str(tmp_path / "run"),
            "--",
            *script("sigint_child.py"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"  # the job's handler is installed
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    assert rest == b"got SIGINT\n"


LEAVER = """
import subprocess, sys
sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
stay = subprocess.Popen(sleeper)  # stays in the job's process group
away = subprocess.Popen(sleeper, start_new_session=True)  # escapes it
print(stay.pid, away.pid, flush=True)
"""


def test_no_process_of_the_job_outlives_trainmedic(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    got = trainmedic(
        "--quiet", "--no-html", "--out", str(run_dir), "--", sys.executable, "-c", LEAVER
    )
    assert got.returncode == 0, got.stderr.decode()
    pids = [int(p) for p in got.stdout.split()]
    assert len(pids) == 2
    alive = [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (stopped,) = [e for e in events if e["kind"] == "leftovers_stopped"]
    assert set(pids) <= set(stopped["data"]["pids"])


def read_pty_until_exit(master: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


def test_on_a_terminal_the_job_sees_a_terminal_and_its_output_stays_whole(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = script("passthrough.py")
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [*TRAINMEDIC, "--no-html", "--out", str(run_dir), "--", *job],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        screen = read_pty_until_exit(master, proc)
        assert proc.wait(60) == 0
    finally:
        os.close(master)
    # One terminal for both streams: the job writes to one pty, in its own order.
    expected = (
        b"tty: 1 1\n"
        b"progress 10%\rprogress 50%\rprogress 100%\n"
        b"warning: partial line\n" + bytes(range(256)) + b"\nno newline at the end"
    )
    assert (run_dir / "output.log").read_bytes() == expected
    assert not (run_dir / "stdout.log").exists()
    text = screen.replace(b"\r\n", b"\n")
    assert b"tty: 1 1\nprogress 10%\rprogress 50%\rprogress 100%\nwarning: partial line\n" in text


def test_without_the_probe_the_job_is_still_watched(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    simulation = Path(__file__).resolve().parents[2] / "examples" / "simulations" / "healthy.json"
    got = trainmedic(
        "--quiet",
        "--no-html",
        "--no-probe",
        "--simulate",
        str(simulation),
        "--out",
        str(run_dir),
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(1.5)",
    )
    assert got.returncode == 0, got.stderr.decode()
    events = [
        json.loads(line)["kind"] for line in (run_dir / "events.jsonl").read_text().splitlines()
    ]
    assert "process_start" not in events  # nothing was loaded into the job
    assert (run_dir / "host.jsonl").read_text().strip()
    assert (run_dir / "gpu.jsonl").read_text().strip()  # simulated GPUs, sampled from outside
    assert json.loads((run_dir / "meta.json").read_text())["gpu_backend"] == "simulated"


def test_an_input_bound_script_gets_its_cause_first(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    got = trainmedic(
        "--quiet",
        "--no-html",
        "--out",
        str(run_dir),
        "--",
        *script("slow_loader.py", 40, 0.004, 0, 8),
    )
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout == b"done 40\n"
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    first = findings[0]
    # The input bottleneck comes first. Its named cause (no workers, or other
    # load on this shared machine) is the diagnosis rules' call.
    assert first["id"].startswith("input.")
    assert first["severity"] in ("warning", "error")
    assert first["evidence"]["data_wait_share"] > 0.5


def test_streams_going_to_one_file_keep_the_jobs_interleaving(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "all.log"
    job = [
        sys.executable,
        "-c",
        "import sys\n"
        "for i in range(50):\n"
        "    (sys.stdout if i % 2 else sys.stderr).write(f'{i}\\n')\n"
        "    sys.stdout.flush()\n"
        "    sys.stderr.flush()\n",
    ]
    with log.open("wb") as f:  # like `trainmedic run ... > all.log 2>&1`
        code = subprocess.run(
            [*TRAINMEDIC, "--quiet", "--no-html", "--out", str(run_dir), "--", *job],
            stdout=f,
            stderr=f,
            timeout=60,
            check=False,
        ).returncode
    assert code == 0
    expected = "".join(f"{i}\n" for i in range(50)).encode()
    assert log.read_bytes().startswith(expected)
    assert (run_dir / "output.log").read_bytes() == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [("abc", "the port must be a number"), ("10.255.255.1:9", "not an address of this machine"),
     ("taken", "already in use")],
)  # fmt: skip
def test_a_bad_prometheus_address_is_refused_before_anything_starts(
    tmp_path: Path, value: str, says: str
) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if value == "taken":
            value = f"127.0.0.1:{busy.getsockname()[1]}"
        marker = tmp_path / "ran"
        out = tmp_path / "run"
        done = trainmedic("--out", str(out), "--prometheus", value, "--",
                          sys.executable, "-c", f"open({str(marker)!r}, 'w')")  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and says in lines[0]
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TRAINMEDIC_PROBE_DISABLE", "stacks,sampled-detail", "(did you mean sampled_detail?)"),
        ("TRAINMEDIC_PROBE_INJECT_FAULT", "all", "names no probe part all"),
        ("TRAINMEDIC_PROBE_PROFILE", "sometimes", "'sometimes' is not one of auto, always, off"),
    ],
)
def test_a_misspelled_probe_part_is_refused_before_the_job_runs(
    variable: str,
    value: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainmedic.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    marker = tmp_path / "ran"
    code = main(["run", "--out", "run", "--", "touch", str(marker)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().count("\n") == 0 and message in err and variable in err
    assert not (tmp_path / "run").exists() and not marker.exists()
    # Without the probe the names mean nothing: the job runs.
    assert (
        main(
            [
                "run",
                "--quiet",
                "--no-html",
                "--no-probe",
                "--out",
                "run",
                "--",
                "touch",
                str(marker),
            ]
        )
        == 0
    )
    assert marker.exists()
