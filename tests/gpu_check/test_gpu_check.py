"""scripts/gpu-check without a GPU: its preflight runs green here, its plugin keeps each
result as it comes (a killed session included), and its summary says what ran and why not.

So a broken gpu-check fails here, not on the GPU machine, which is lent for minutes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from gpu_check_results import JUNIT_FILE, RESULTS_FILE, SUMMARY_FILE, Results, summary_markdown

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check"
HERE = Path(__file__).resolve().parent

FAKE_TESTS = '''
import signal
import time

import pytest


def test_passes():
    pass


def test_fails():
    assert 1 == 2, "one is not two"


@pytest.mark.skip(reason="needs two GPUs")
def test_skips():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")


def test_with_a_broken_fixture(broken):
    pass


def test_runs_past_the_limit():
    time.sleep(30)


def test_runs_past_the_limit_and_catches_exceptions():
    try:
        time.sleep(30)
    except Exception:
        pass


def test_after_the_timeouts():
    pass


def test_stuck_where_python_cannot_interrupt():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(30)


def test_never_reached():
    pass
'''


def rows(summary: str) -> dict[str, list[str]]:
    """The summary's test table: test id -> [part, result, seconds, why]."""
    out = {}
    for line in summary.partition("## Tests")[2].splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0] not in ("part", "---"):
            out[cells[1]] = [cells[0], *cells[2:]]
    return out


def part_rows(summary: str) -> dict[str, list[str]]:
    """The summary's part table: part -> [status, seconds, budget, note]."""
    table = summary.split("## Tests")[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[0] not in ("part", "---"):
            out[cells[0]] = cells[1:]
    return out


def test_the_plugin_keeps_each_result_and_the_limit_fails_or_ends_a_test(tmp_path: Path) -> None:
    tests = tmp_path / "fake"
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\n")
    (tests / "test_fake.py").write_text(FAKE_TESTS)
    (tests / "test_unimportable.py").write_text("import no_such_module_here\n")
    (tests / "test_skipped_whole.py").write_text(
        "import pytest\npytest.skip('no CUDA device', allow_module_level=True)\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(HERE), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "gpu_check_plugin", "-p", "no:cacheprovider",
         "-c", str(tests / "pytest.ini"), "--rootdir", str(tests),
         "--continue-on-collection-errors", "--gpu-check-out", str(out),
         "--gpu-check-part", "fake", "--gpu-check-timeout", "0.5", "--gpu-check-grace", "0.5",
         str(tests)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    # faulthandler ended the session at the stuck test: what came before is kept.
    assert done.returncode == 1, done.stdout + done.stderr
    got = {test: [row[1], row[3]] for test, row in rows((out / SUMMARY_FILE).read_text()).items()}
    limit = "gpu_check_plugin.GpuCheckTimeLimit: ran past gpu-check's per-test limit of 0.5 s"
    timeout = ["TIMEOUT", limit]
    unimportable = "ModuleNotFoundError: No module named 'no_such_module_here'"
    assert got == {
        "test_unimportable.py": ["ERROR", unimportable],
        "test_skipped_whole.py": ["skipped", "no CUDA device"],
        "test_fake.py::test_passes": ["passed", ""],
        "test_fake.py::test_fails": ["FAILED", "AssertionError: one is not two"],
        "test_fake.py::test_skips": ["skipped", "needs two GPUs"],
        "test_fake.py::test_with_a_broken_fixture": ["ERROR", "RuntimeError: the fixture broke"],
        "test_fake.py::test_runs_past_the_limit": timeout,
        "test_fake.py::test_runs_past_the_limit_and_catches_exceptions": timeout,
        "test_fake.py::test_after_the_timeouts": ["passed", ""],
        "test_fake.py::test_stuck_where_python_cannot_interrupt": [
            "KILLED", "started, never ended: its session was stopped here",
        ],
    }  # fmt: skip
    assert "test_stuck_where_python_cannot_interrupt" in (out / "gpu-check-hang.txt").read_text()
    suite = ET.parse(out / JUNIT_FILE).getroot().find("testsuite[@name='fake']")
    assert suite is not None
    counts = {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "10", "failures": "4", "errors": "2", "skipped": "2"}


def test_the_summary_names_the_part_a_kill_stopped() -> None:
    lines = [
        {"kind": "part", "event": "start", "part": "preflight", "budget_s": 40},
        {"kind": "part", "event": "end", "part": "preflight", "status": "ok", "rc": 0,
         "seconds": 3, "note": "python 3.12.3, torch 2.11.0+cu130"},
        {"kind": "part", "event": "start", "part": "gpu", "budget_s": 210},
        {"kind": "test", "event": "start", "part": "gpu", "test": "t.py::a"},
        {"kind": "test", "event": "end", "part": "gpu", "test": "t.py::a", "result": "passed",
         "seconds": 1.5},
        {"kind": "test", "event": "start", "part": "gpu", "test": "t.py::b|c"},
        '{"kind": "test", "event": "end", "part": "gpu", "te',  # cut short by the kill
    ]  # fmt: skip
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    res = Results.of(json.loads(x) for x in text.splitlines() if x.endswith("}"))
    summary = summary_markdown(res)
    assert "gpu-check did not finish: it was stopped during gpu." in summary
    assert part_rows(summary) == {
        "preflight": ["ok", "3.0", "40.0", "python 3.12.3, torch 2.11.0+cu130"],
        "gpu": ["KILLED (started, never ended)", "", "210.0", "1 KILLED, 1 passed"],
    }
    assert rows(summary)["t.py::b\\|c"][1] == "KILLED"


def run_gpu_check(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, Path]:
    out = tmp_path / "out"
    environ = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), **env}
    environ.pop("TRAINMEDIC_REQUIRE_GPU", None)
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=170,
        cwd=tmp_path, env=environ,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr, out


def test_the_preflight_runs_green_here_and_collects_every_gpu_test(tmp_path: Path) -> None:
    # All but the probe's tests, which the default suite runs anyway.
    status, output, out = run_gpu_check(
        tmp_path, "--preflight", GPU_CHECK_PARTS="preflight,nvidia-smi,doctor,run,gpu"
    )
    assert status == 0, output[-4000:]
    summary = (out / SUMMARY_FILE).read_text()
    assert summary.startswith("# gpu-check summary\n\ngpu-check finished: passed.")
    parts = part_rows(summary)
    assert list(parts) == ["preflight", "nvidia-smi", "doctor", "run", "gpu"]
    assert [parts[p][0] for p in ("preflight", "doctor", "run", "gpu")] == ["ok"] * 4
    # Run as on the GPU machine: without plotly, `run` still succeeds.
    assert "without plotly" in parts["preflight"][3]
    assert parts["run"][3] == "no report.html: plotly is not installed"
    assert (out / "doctor.json").is_file() and (out / "gpu-check.log").is_file()
    # Every GPU test file was imported (a broken one is an ERROR row) and each test skipped.
    tests = rows(summary)
    gpu_files = subprocess.run(
        ["grep", "-rl", "--include=test_*.py", "pytest[.]mark[.]gpu", "tests"],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout.split()  # fmt: skip
    assert {t.split("::")[0] for t in tests} >= set(gpu_files)
    assert {row[1] for row in tests.values()} == {"skipped"}, tests
    assert all(row[0] == "gpu" for row in tests.values())
    junit = ET.parse(out / JUNIT_FILE).getroot()
    assert [s.get("name") for s in junit] == ["gpu-check.parts", "gpu"]
    assert all(s.get("failures") == s.get("errors") == "0" for s in junit)
    assert (out / RESULTS_FILE).read_text().count('"kind": "part"') == 2 * len(parts)


def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path) -> None:
    status, output, out = run_gpu_check(tmp_path, GPU_CHECK_PARTS="preflight,gpu")
    assert status == 2, output[-4000:]
    parts = part_rows((out / SUMMARY_FILE).read_text())
    assert parts["preflight"][0] == "FAILED"
    assert parts["gpu"][0] == "skipped" and parts["gpu"][3] == "no usable CUDA GPU (see preflight)"


def test_a_missing_required_package_is_one_line_and_exits_2(tmp_path: Path) -> None:
    status, output, out = run_gpu_check(
        tmp_path, GPU_CHECK_PARTS="preflight,gpu", GPU_CHECK_ABSENT="prometheus_client"
    )
    assert status == 2, output[-4000:]
    (line,) = [ln for ln in output.splitlines() if ln.startswith("gpu-check: missing")]
    assert line.startswith("gpu-check: missing required packages: prometheus-client (")
    parts = part_rows((out / SUMMARY_FILE).read_text())
    assert parts["gpu"][0] == "skipped"
    assert parts["gpu"][3] == "required packages missing (see preflight)"



@pytest.mark.parametrize(
    ("args", "says"),
    [(["--bogus"], "unrecognized arguments: --bogus"),
     (["tests/no_such_test.py"], "not found: tests/no_such_test.py")],
)  # fmt: skip
def test_extra_arguments_pytest_refuses_are_one_line_before_anything_runs(
    tmp_path: Path, args: list[str], says: str
) -> None:
    status, output, _ = run_gpu_check(tmp_path, "--preflight", *args)
    assert status == 2, output[-4000:]
    (line,) = [ln for ln in output.splitlines() if ln.startswith("gpu-check: pytest refuses")]
    assert says in line
    assert "== preflight" not in output  # nothing ran
