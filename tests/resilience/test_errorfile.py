"""The error file: written by the probe when a process dies, read by the supervisor."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trainmedic.probe import crash
from trainmedic.resilience.classify import FailureClass, FailureEvidence, classify_failure
from trainmedic.resilience.errorfile import (
    ERRORS_SUBDIR,
    ErrorReport,
    is_user_code,
    read_error_file,
    read_error_reports,
)


def _raise_in_user_code() -> None:
    values: dict[str, int] = {}
    values["missing"] += 1


def write_probe_error_file(run_dir: Path, pid: int) -> Path:
    """Make a real exception and let the probe's own writer record it."""
    try:
        try:
            _raise_in_user_code()
        except KeyError as e:
            raise RuntimeError("step failed") from e
    except RuntimeError:
        exc_type, exc, tb = sys.exc_info()
        assert exc_type is not None
        event = crash.exception_event("exception", exc_type, exc, tb, pid)
    return crash.write_error_file(str(run_dir), event, ["train.py", "--lr", "0.1"])


def test_reads_what_the_probe_writes(tmp_path: Path) -> None:
    path = write_probe_error_file(tmp_path, pid=4242)
    assert path.parent == tmp_path / ERRORS_SUBDIR
    report = read_error_file(path)
    assert report.pid == 4242
    assert report.exc_type == "RuntimeError"
    assert report.message == "step failed"
    assert "KeyError: 'missing'" in report.traceback  # the chained cause is kept
    assert report.t > 1.6e9
    assert report.frames[-1].function == "write_probe_error_file"
    assert report.location is not None
    assert report.location.endswith("in write_probe_error_file")


def test_probe_error_file_drives_the_classifier(tmp_path: Path) -> None:
    write_probe_error_file(tmp_path, pid=77)
    reports = tuple(read_error_reports(tmp_path / ERRORS_SUBDIR))
    c = classify_failure(FailureEvidence(exit_code=1, error_reports=reports))
    assert c.failure_class is FailureClass.USER_EXCEPTION
    assert c.details["exception_type"] == "RuntimeError"
    assert c.location is not None and "write_probe_error_file" in c.location


def test_torchelastic_error_files_are_understood(tmp_path: Path) -> None:
    path = tmp_path / "error-77.json"
    message = "RuntimeError: CUDA error: an illegal memory access was encountered"
    extra = {"py_callstack": "Traceback ...", "timestamp": "1717000000"}
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))
    report = read_error_file(path)
    assert (report.exc_type, report.pid, report.t) == ("RuntimeError", 77, 1717000000.0)
    assert report.message == "CUDA error: an illegal memory access was encountered"
    assert report.traceback == "Traceback ..."


def test_optional_fields_and_qualified_types() -> None:
    data: dict[str, Any] = {
        "message": {"message": "OutOfMemoryError: CUDA out of memory.", "extraInfo": {}},
        "type": "torch.OutOfMemoryError",
        "pid": 9,
        "t": 1717000000.25,
        "rank": 3,
        "step": 1200,
        "phase": "eval",
    }
    report = ErrorReport.from_dict(data)
    assert report == ErrorReport(
        t=1717000000.25,
        pid=9,
        exc_type="torch.OutOfMemoryError",
        message="CUDA out of memory.",
        rank=3,
        step=1200,
        phase="eval",
    )
    builtin = ErrorReport.from_dict({"message": "KeyError: 'x'", "type": "builtins.KeyError"})
    assert (builtin.exc_type, builtin.message) == ("KeyError", "'x'")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"something": 1}', "not an error file"),
        ('{"message": "x", "type": 5}', "type is not a string"),
        ('{"message": "x", "rank": "zero"}', "wrong type"),
        ('{"message": {"message": "x", "extraInfo": []}}', "extraInfo"),
    ],
)
def test_malformed_files_raise_value_errors_naming_the_problem(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "error-1.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=problem):
        read_error_file(path)


def test_reports_of_a_directory_come_earliest_first_and_skip_bad_files(tmp_path: Path) -> None:
    for pid, t in ((2, 200.0), (10, 100.0)):
        body = {"message": f"E{pid}: boom", "pid": pid, "t": t}
        (tmp_path / f"error-{pid}.json").write_text(json.dumps(body))
    (tmp_path / "error-3.json").write_text("garbage")
    assert [r.pid for r in read_error_reports(tmp_path)] == [10, 2]
    assert read_error_reports(tmp_path / "missing") == []


def test_user_code_is_told_from_libraries_by_path_shape() -> None:
    assert is_user_code("/home/user/train.py")
    assert not is_user_code("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py")
    assert not is_user_code("/usr/lib/python3.10/threading.py")
    assert not is_user_code("/usr/lib/python3/dist-packages/numpy/core/numeric.py")
    assert not is_user_code("<frozen runpy>")
