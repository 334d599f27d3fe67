"""`trainmedic doctor` from the command line: output, JSON, exit codes, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from trainmedic.cli.main import main
from trainmedic.findings.schema import findings_schema

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "simulations"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_gpu_machine_reports_missing_driver_as_info(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--simulate", str(EXAMPLES / "no-driver.json"),
                           "--json")
    doc = json.loads(out)
    jsonschema.validate(doc, findings_schema())
    ids = {f["id"]: f for f in doc["findings"]}
    assert "inventory.no_gpu" in ids
    assert ids["inventory.no_gpu"]["severity"] == "info"
    assert code == 0


def test_real_machine_json_validates(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--json", "--fail-on", "never")
    doc = json.loads(out)
    jsonschema.validate(doc, findings_schema())
    assert code == 0
    # Host checks ran: the context names this machine.
    assert doc["context"]["hostname"]


def test_json_to_file_also_prints_the_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "findings.json"
    code, out, _ = run_cli(
        capsys, "doctor", "--simulate", str(EXAMPLES / "healthy.json"), "--json", str(target)
    )
    assert code == 0
    doc = json.loads(target.read_text())
    jsonschema.validate(doc, findings_schema())
    assert "trainmedic doctor" in out
    assert "summary:" in out


def test_fail_on_controls_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    sim = str(EXAMPLES / "thermal-throttling.json")
    code_error, _, _ = run_cli(capsys, "doctor", "--simulate", sim, "--json")
    code_never, _, _ = run_cli(capsys, "doctor", "--simulate", sim, "--json", "--fail-on", "never")
    code_info, _, _ = run_cli(
        capsys, "doctor", "--simulate", str(EXAMPLES / "healthy.json"), "--json", "--fail-on",
        "info",
    )
    assert code_error == 1
    assert code_never == 0
    assert code_info == 1  # healthy still has info findings (the inventory)


def test_terminal_report_groups_and_shows_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "doctor", "--simulate", str(EXAMPLES / "thermal-throttling.json"),
        "--fail-on", "never",
    )
    assert code == 0
    assert "[thermal]" in out
    assert any(line.split()[:1] == ["fix"] for line in out.splitlines())
    assert "ERROR" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["doctor", "--no-such-flag"], "--no-such-flag"),
        (["doctor", "--fail-on", "fatal"], "fatal"),
        (["doctor", "--data-dir", "/definitely/not/here"], "/definitely/not/here"),
        (["doctor", "--data-url", "ftp://example.com/x"], "ftp://example.com/x"),
        (["doctor", "--data-url", "http://"], "http://"),
        (["doctor", "--simulate", "/no/such/sim.json"], "/no/such/sim.json"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("trainmedic: error:")
    assert needle in lines[0]
    assert "Traceback" not in err + out


def test_malformed_simulation_names_file_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sim = tmp_path / "bad.json"
    sim.write_text(json.dumps({"driver": {"version": "550.1", "cuda_version": "12.4"},
                               "gpus": [{"name": "X", "uuid": "GPU-1"}]}))
    code, _, err = run_cli(capsys, "doctor", "--simulate", str(sim))
    assert code == 2
    assert str(sim) in err and "gpus[0].memory_total_bytes" in err
    sim.write_text("{not json")
    code, _, err = run_cli(capsys, "doctor", "--simulate", str(sim))
    assert code == 2 and "not valid JSON" in err and str(sim) in err


def test_unreadable_data_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every directory")
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0)
    try:
        code, _, err = run_cli(capsys, "doctor", "--data-dir", str(d))
    finally:
        d.chmod(0o700)
    assert code == 2 and str(d) in err


def test_console_script_and_module_entry_points() -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    for argv in (["-m", "trainmedic", "doctor", "--json", "--fail-on", "never"],):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["schema_version"] == 1
    bad = subprocess.run([sys.executable, "-m", "trainmedic", "doctor", "--bogus"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
