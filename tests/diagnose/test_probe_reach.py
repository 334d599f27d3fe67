"""A Python process that ran without the probe: a warning that says what was seen and why."""

from __future__ import annotations

from typing import Any

from support.builders import JOB_PID, make_event, make_record, make_steps
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.probe_reach import probe_reach
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Severity

TH = Thresholds()


def census(*processes: dict[str, Any], probe: bool = True) -> Any:
    return make_event("process_census", pid=None, probe=probe, processes=list(processes))


def python(pid: int, lived: float = 60.0, **kw: Any) -> dict[str, Any]:
    entry = {
        "pid": pid, "name": "python3", "exe": "/usr/bin/python3.11",
        "argv": ["python3", "train.py"], "python": True, "lived_s": lived, "cpu_s": lived * 0.9,
        "probe_env": True, "pythonpath": "/opt/project", "bootstrap_on_path": False, "flags": [],
    }  # fmt: skip
    entry.update(kw)
    return entry


def test_a_replaced_pythonpath_without_the_hook_is_a_warning_with_both_fixes() -> None:
    record = make_record(events=[census(python(777), {"pid": 776, "name": "bash", "python": False,
                                                      "lived_s": 60.0})])  # fmt: skip
    (f,) = probe_reach(RunView.of(record), TH)
    assert f.id == "probe.not_loaded" and f.severity is Severity.WARNING
    assert "0 steps seen" in f.title
    assert "replaced PYTHONPATH ('/opt/project')" in f.evidence["reason"]
    assert "/usr/bin/python3.11 -m pip install trainmedic" in f.fix
    assert "$PYTHONPATH" in f.fix
    assert [p["pid"] for p in f.evidence["processes"]] == [777]
    # It outranks the "too few steps" note it replaces.
    assert [x.id for x in diagnose_run(record)] == ["probe.not_loaded"]


def test_cleared_environment_and_minus_s_get_their_own_fixes() -> None:
    cleared = make_record(events=[census(python(5, probe_env=False))])
    (f,) = probe_reach(RunView.of(cleared), TH)
    assert "env -i" in f.fix
    no_site = make_record(events=[census(python(5, flags=["-S"]))])
    (f,) = probe_reach(RunView.of(no_site), TH)
    assert "-S" in f.evidence["reason"]


def test_a_probe_that_failed_to_load_says_why() -> None:
    failed = make_event("probe_error", "probe could not load: SyntaxError: ...", pid=5,
                        part="bootstrap")  # fmt: skip
    (f,) = probe_reach(RunView.of(make_record(events=[census(python(5)), failed])), TH)
    assert "SyntaxError" in f.evidence["reason"]


def test_reached_short_lived_and_probe_off_are_quiet() -> None:
    reached = make_record(
        make_steps(20), events=[census(python(JOB_PID)), make_event("process_start", pid=JOB_PID)]
    )
    assert probe_reach(RunView.of(reached), TH) == []
    short = make_record(events=[census(python(9, lived=4.9))])
    assert probe_reach(RunView.of(short), TH) == []
    off = make_record(events=[census(python(9), probe=False)])  # --no-probe
    assert probe_reach(RunView.of(off), TH) == []


def test_a_launcher_that_trains_in_a_probed_child_is_partly_blind() -> None:
    # The probed child trained; a second interpreter ran unmeasured alongside.
    record = make_record(make_steps(50), events=[census(python(JOB_PID), python(31, lived=30.0))])
    (f,) = probe_reach(RunView.of(record), TH)
    assert f.title.startswith("The diagnosis misses part of the job")
    assert f.evidence["steps_seen"] == 50
