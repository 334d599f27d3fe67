"""``trainmedic tune``: real measurements, and one-line errors for everything a user can mistype."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from trainmedic.cli.main import main
from trainmedic.cli.tune_cmd import _print_tuning
from trainmedic.remedies.loader_search import summarize

from .test_loader_search import Machine, search

SCRIPTS = Path(__file__).parent / "scripts"


@dataclass
class Got:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def tune(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> object:
    """``trainmedic tune ...`` in this process (the user's modules import from SCRIPTS)."""

    def run(*args: str, cwd: Path = SCRIPTS) -> Got:
        monkeypatch.chdir(cwd)
        monkeypatch.syspath_prepend(str(cwd))
        code = main(["tune", *args])
        out = capsys.readouterr()
        return Got(code, out.out, out.err)

    return run


def test_a_latency_bound_dataset_gets_much_faster_settings_with_their_interval(tune) -> None:  # type: ignore[no-untyped-def]
    # Waiting costs no CPU, so this holds on a loaded machine too.
    got = tune("dataloader", "loader_data:waiting_loader", "--budget", "4", "--json")
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    assert result["best"]["num_workers"] >= 1
    assert result["best"]["num_workers"] * result["best"]["threads"] >= 4
    assert result["speedup"] >= 2.0
    low, high = result["speedup_ci"]
    assert 1.0 < low <= result["speedup"] <= high
    assert result["significant"] is True
    assert result["baseline"]["settings"]["num_workers"] == 0  # the loader's own settings
    assert result["batch_size"] == 16
    assert result["profile"]["kind"] == "latency"
    assert result["dataset_type"] == "loader_data.Waiting"
    assert len(result["dataset_code"]) == 64  # which file defines it: --apply-from checks
    assert result["elapsed_s"] <= 4.0 + 5.0  # the budget, and the start-up of the last trial


def test_the_terminal_report_has_the_table_the_code_and_the_speedup() -> None:
    machine = Machine(cores=2, cpu_s=0.002, wait_s=0.0)
    s = search(machine)
    result = summarize(s, *s.run(), 3.0)
    out = io.StringIO()
    _print_tuning(Console(file=out, width=200), result)
    text = out.getvalue()
    assert "workers=2 prefetch=2" in text and "samples/s" in text
    assert f"speed-up over the current settings: {result.speedup:.2f}x (95 % CI" in text
    assert "DataLoader(dataset, batch_size=32, num_workers=2, prefetch_factor=4, " in text


@pytest.mark.slow
def test_the_command_as_users_run_it_writes_its_json_file(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    got = subprocess.run(
        [
            *(sys.executable, "-m", "trainmedic", "tune", "dataloader"),
            *(f"{SCRIPTS / 'loader_data.py'}:waiting", "--budget", "3", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(out.read_text())["tool"] == "tune-dataloader"
    assert "Traceback" not in got.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "is not MODULE:FACTORY"),
        ("loader_data:", "is not MODULE:FACTORY"),
        ("loader_data:no such", "is not a Python name"),
        ("no_such_module:f", "no module named 'no_such_module'"),
        ("missing.py:f", "missing.py: no such file"),
        ("loader_data:nope", "loader_data has no 'nope'"),
        ("loader_data:NOT_CALLABLE", "is a int, not a function"),
        ("broken_module:f", "importing broken_module failed: ValueError: math domain error at"),
        ("loader_data:raises", "loader_data:raises raised ValueError: no data at /mnt/missing at"),
        ("loader_data:not_a_dataset", "expected a Dataset or a DataLoader, got builtins.int"),
        ("loader_data:empty", "the dataset is empty"),
        ("loader_data:broken_samples", "your code raised KeyError"),
    ],
)
def test_bad_factories_are_one_line_errors_with_exit_2(tune, spec: str, message: str) -> None:  # type: ignore[no-untyped-def]
    got = tune("dataloader", spec, "--budget", "2")
    assert got.returncode == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainmedic: error: "), got.stderr
    assert message in lines[0]
    assert "Traceback" not in got.stderr


def test_verbose_shows_the_users_own_traceback(tune) -> None:  # type: ignore[no-untyped-def]
    got = tune("dataloader", "loader_data:raises", "--verbose")
    assert got.returncode == 2
    assert "Traceback" in got.stderr and "in helper" in got.stderr
    assert got.stderr.strip().splitlines()[-1].startswith("trainmedic: error: ")


def test_a_budget_too_small_is_a_usage_error(tune) -> None:  # type: ignore[no-untyped-def]
    got = tune("dataloader", "loader_data:waiting", "--budget", "0.5")
    assert got.returncode == 2 and "--budget" in got.stderr


def test_batch_size_finds_the_largest_fit(tune, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "problem.py").write_text(
        "import torch\n"
        "class Capped(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        "        if len(x) > 24:\n"
        "            raise RuntimeError('CUDA out of memory. Tried to allocate 1 GiB')\n"
        "        return super().forward(x)\n"
        "def make():\n"
        "    return {'model': Capped(3, 2), 'sample': torch.zeros(3)}\n"
    )
    got = tune("batch-size", "problem:make", "--effective-batch-size", "64", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    assert result["largest_fit"] == 24 and result["first_failure"] == 25
    assert result["micro_batch_size"] * result["accumulation_steps"] == 64


def test_an_unwritable_json_file_is_refused_before_measuring(tune, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    got = tune("dataloader", "loader_data:waiting", "--json", str(tmp_path / "no" / "x.json"))
    assert got.returncode == 2 and "does not exist" in got.stderr


def test_what_the_users_code_prints_does_not_spoil_the_json(tune, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "chatty.py").write_text(
        "import torch\n"
        "def make():\n"
        "    print('building the model')\n"
        "    return {'model': torch.nn.Linear(2, 2), 'sample': torch.zeros(2)}\n"
    )
    got = tune("batch-size", "chatty:make", "--max-size", "8", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["largest_fit"] == 8
    assert "building the model" in got.stderr


def _report(machine: Machine) -> str:
    s = search(machine)
    result = summarize(s, *s.run(), 3.0)
    out = io.StringIO()
    _print_tuning(Console(file=out, width=200), result)
    return out.getvalue()


def test_no_advice_when_every_other_setting_failed() -> None:
    # Samples that cannot be collated fail in every worker: only the loop itself runs.
    text = _report(Machine(cores=2, cpu_s=0.002, wait_s=0.0, fail=set(range(1, 65))))
    assert "keep them" not in text
    assert "No advice: only the current settings could be measured" in text
    assert "DataLoader worker exited unexpectedly" in text


def test_no_advice_when_the_current_settings_fail() -> None:
    text = _report(Machine(cores=2, cpu_s=0.002, wait_s=0.0, fail=set(range(0, 65))))
    assert "keep them" not in text and "speed-up" not in text
    assert "No advice: the current settings failed (RuntimeError: DataLoader worker" in text


def test_keeping_the_current_settings_says_how_many_were_measured() -> None:
    # One core: a worker is no faster than the loop itself (the others fail here).
    text = _report(Machine(cores=1, cpu_s=0.002, wait_s=0.0, fail={2, 3, 4}))
    assert "The current settings are the fastest of the 2 measured: keep them." in text


@pytest.mark.parametrize(
    "args", [["dataloader", "blocking_code:factory"], ["dataloader", "blocking_code:stuck_dataset"],
             ["batch-size", "blocking_code:factory"]],
)  # fmt: skip
def test_code_that_never_returns_is_stopped_at_the_budget(
    tune, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    from trainmedic.cli import bounded

    monkeypatch.setattr(bounded, "STARTUP_S", 4.0)
    pids = tmp_path / "pids"
    monkeypatch.setenv("BLOCKING_PID_FILE", str(pids))
    got = tune(*args, "--budget", "2")
    assert got.returncode == bounded.OVERRUN_EXIT
    assert f"tune {args[0]} was stopped at its budget (2 s" in got.stderr
    assert got.stderr.count("Traceback") == 0
    for pid in map(int, pids.read_text().split()):  # the child and any worker: gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_local_module_hidden_by_the_standard_librarys_is_named(tune, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "json.py").write_text("def good():\n    return list(range(10))\n")
    got = tune("dataloader", "json:good", "--budget", "2", cwd=tmp_path)
    assert got.returncode == 2
    assert "json has no 'good' (json is the module from " in got.stderr
    assert "which hides your json.py here: give its path, ./json.py:..., or rename it" in got.stderr


def test_code_that_ends_the_process_is_said_so(tune) -> None:  # type: ignore[no-untyped-def]
    got = tune("dataloader", "blocking_code:exits", "--budget", "2")
    assert got.returncode == 1
    assert "tune dataloader ended without a result: your code ended the process" in got.stderr
