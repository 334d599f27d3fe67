"""Time outside the step in loops without a DataLoader: data only where the stacks say so."""

from __future__ import annotations

import pytest

from support.builders import (
    JOB_PID,
    make_activity,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.host_time import host_time
from trainmedic.diagnose.input_bound import input_bound
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Severity
from trainmedic.record.types import RunRecord

TH = Thresholds()


def loop(outside: float = 0.06, duration: float = 0.1, *, stacks: dict[str, int] | None = None,
         gpu: bool = False, **kw: object) -> RunRecord:  # fmt: skip
    """200 steps of ``duration`` s with ``outside`` s outside forward/backward/optimizer,
    no DataLoader, the training thread's stacks between steps as given."""
    return make_record(
        make_steps(200, duration, outside),
        host=make_host_series(25, usable_cores=2.0, job_cpu_pct=100.0),
        activity=[make_activity(pid=JOB_PID, **(stacks or {}))] if stacks else [],
        gpu=make_gpu_series(25, utilization_gpu_pct=30.0) if gpu else [],
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("state", "finding", "category"),
    [
        ("sleep", "host.sleep", Category.FRAMEWORK_CONFIG),
        ("log", "host.log", Category.FRAMEWORK_CONFIG),
        ("file_write", "host.file_write", Category.IO),
        ("python", "host.python", Category.CPU),
        ("other", "host.other", Category.FRAMEWORK_CONFIG),
    ],
)
def test_what_the_loop_does_names_the_finding_and_never_dataloader_workers(
    state: str, finding: str, category: Category
) -> None:
    record = loop(stacks={state: 90, "python": 0 if state != "python" else 90})
    view = RunView.of(record)
    (f,) = host_time(view, TH)
    assert (f.id, f.category) == (finding, category)
    assert f.severity is Severity.ERROR and f.impact == pytest.approx(0.6)
    assert "num_workers" not in f.fix and "DataLoader(" not in f.fix
    assert input_bound(view, TH) == []  # none of it is waiting for data
    assert diagnose_run(record)[0].id == finding


def test_a_split_loop_reports_each_part_that_costs_enough() -> None:
    # 60 % outside the step: a third sleeping, two thirds building batches.
    record = loop(stacks={"sleep": 30, "transform": 60})
    view = RunView.of(record)
    (sleep,) = host_time(view, TH)
    assert sleep.id == "host.sleep" and sleep.impact == pytest.approx(0.2)
    (data,) = input_bound(view, TH)
    assert data.id == "input.workers" and data.impact == pytest.approx(0.4)
    assert "the loop builds every batch itself" in data.title
    assert "into a Dataset" in data.fix  # no DataLoader to raise num_workers on


def test_syncs_on_a_gpu_run_are_waits_for_the_gpu() -> None:
    record = loop(stacks={"sync": 90}, gpu=True)
    (f,) = host_time(RunView.of(record), TH)
    assert f.id == "host.sync" and "waits for the GPU" in f.title
    assert ".item()" in f.fix


def test_syncs_on_a_cpu_only_run_are_python_work() -> None:
    (f,) = host_time(RunView.of(loop(stacks={"sync": 50, "python": 40})), TH)
    assert f.id == "host.python" and f.impact == pytest.approx(0.6)


def test_without_stack_samples_the_time_is_not_called_data() -> None:
    record = loop(stacks={"transform": 5})  # too few samples to tell
    view = RunView.of(record)
    (f,) = host_time(view, TH)
    assert f.id == "host.unexplained" and f.impact == pytest.approx(0.6)
    assert input_bound(view, TH) == []
    assert "py-spy" in f.fix


def test_little_time_outside_the_step_is_quiet() -> None:
    assert host_time(RunView.of(loop(0.019, stacks={"sleep": 90})), TH) == []


def test_a_dataloader_run_leaves_the_time_to_the_input_rule() -> None:
    record = loop(stacks={"sleep": 90}, loaders=[make_loader(2)])
    assert host_time(RunView.of(record), TH) == []


def test_stall_time_is_the_stall_rules() -> None:
    # 195 quick steps and 5 of 3 s, each sleeping through: only the ordinary sleep counts.
    durations = [0.1] * 195 + [3.0] * 5
    steps = make_steps(200, durations=durations, wait=0.02)
    steps = [s.__class__(**{**s.__dict__, "data_wait_s": s.duration_s * 0.2}) for s in steps]
    record = make_record(
        steps,
        host=make_host_series(40, usable_cores=2.0),
        activity=[make_activity(pid=JOB_PID, sleep=90)],
    )
    view = RunView.of(record)
    ordinary = 0.02 * 195 / (0.1 * 195 + 15.0)
    assert ordinary < TH.data_wait_warning_share
    assert host_time(view, TH) == []  # 3 s of each stall's 0.6 s sleep is not counted here


def test_a_part_whose_interval_straddles_the_bar_is_information() -> None:
    # 60 % of the step outside it; 9 of 25 samples logging: 36 % of samples, 22 % of the
    # step - but anywhere from 12 % to 33 %: said, not decided.
    (f,) = [f for f in diagnose_run(loop(stacks={"log": 9, "python": 4, "sleep": 12}),
                                    strict=True) if f.id == "host.log"]  # fmt: skip
    assert f.severity is Severity.INFO and f.evidence["settled"] is False
    low, high = f.evidence["outside_part_interval"]
    assert low < TH.data_wait_warning_share < high
    assert "Not settled" in f.fix


def test_an_error_needs_the_whole_interval_past_the_error_bar() -> None:
    # 60 % outside, all of 25 samples sleeping: 60 %, but 53-60 %: an error
    (f,) = host_time(RunView.of(loop(stacks={"sleep": 25})), TH)
    assert f.severity is Severity.ERROR
    # 60 % outside, 21 of 25 sleeping: 50 %, the interval reaching down to 41 %: a warning
    (f,) = host_time(RunView.of(loop(stacks={"sleep": 21, "python": 4})), TH)
    assert f.id == "host.sleep" and f.severity is Severity.WARNING


def test_tensor_work_too_small_to_hand_to_a_worker_is_the_loops_own() -> None:
    # 0.2 ms steps, 60 % outside, a third of it building the batch (0.04 ms a step): a
    # worker's hand-off of a batch costs more than that; no DataLoader advice.
    record = make_record(
        make_steps(300, 0.0002, 0.00012, samples=32),
        host=make_host_series(2, usable_cores=2.0, job_cpu_pct=100.0),
        activity=[make_activity(pid=JOB_PID, transform=10, python=20)],
    )
    findings = diagnose_run(record, strict=True)
    assert [f.id for f in findings] == ["host.python"]
    assert findings[0].impact == pytest.approx(0.6)
    assert "larger batch" in findings[0].fix and "DataLoader" not in findings[0].fix
