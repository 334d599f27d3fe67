"""The overall verdict: healthy runs say so with no warning; too few steps say that."""

from __future__ import annotations

from dataclasses import replace

from support.builders import (
    GIB,
    make_activity,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_machine,
    make_record,
    make_steps,
)
from trainmedic.diagnose import RULES, diagnose_run
from trainmedic.findings.model import Category, Severity
from trainmedic.record.types import RunRecord

from .canonical import healthy_cpu, healthy_gpu


def severities(record: RunRecord) -> list[Severity]:
    return [f.severity for f in diagnose_run(record)]


def test_healthy_gpu_run_is_compute_bound_information_only() -> None:
    findings = diagnose_run(healthy_gpu())
    assert [f.id for f in findings] == ["run.healthy"]
    (f,) = findings
    assert f.severity is Severity.INFO and f.category is Category.GPU_CAPACITY
    assert "compute-bound" in f.title
    assert f.evidence["gpu_busy_share"] == 0.96 and f.impact == 0.0


def test_healthy_gpu_run_stays_quiet_with_doctor_facts() -> None:
    findings = diagnose_run(healthy_gpu(), make_machine(cores=16))
    assert [f.id for f in findings] == ["run.healthy"]


def test_healthy_cpu_only_run_has_no_warning() -> None:
    findings = diagnose_run(healthy_cpu())
    assert [f.id for f in findings] == ["run.healthy"]
    (f,) = findings
    assert f.category is Category.CPU and "compute-bound on the CPU" in f.title
    assert f.evidence["job_cpu_cores"] == 15.5


def test_cpu_only_run_with_idle_cores_finds_no_bottleneck() -> None:
    record = make_record(make_steps(100, 0.3, 0.01), host=make_host_series(35, job_cpu_pct=300.0))
    (f,) = diagnose_run(record)
    assert f.id == "run.healthy" and "CPU-only" in f.title and f.category is Category.MODEL


def test_cpu_only_run_without_host_samples_or_loaders_is_healthy() -> None:
    assert [f.id for f in diagnose_run(make_record(make_steps(50, 0.3, 0.01)))] == ["run.healthy"]


def test_healthy_fp32_run_on_an_old_gpu_has_no_warning() -> None:
    record = make_record(
        make_steps(200, 0.2, 0.002, autocast=False),
        gpu=make_gpu_series(45, compute_capability=(7, 0), memory_used_bytes=20 * GIB),
        host=make_host_series(45),
    )
    assert severities(record) == [Severity.INFO]


def test_information_findings_do_not_spoil_health() -> None:
    steps = make_steps(1000, 0.1)
    steps[500] = replace(steps[500], duration_s=1.5)  # one small stall: information
    findings = diagnose_run(make_record(steps))
    # both information; the stall costs time (impact > 0), health costs none
    assert [f.id for f in findings] == ["stall.framework_config", "run.healthy"]
    assert all(f.severity is Severity.INFO for f in findings)


def test_a_warning_replaces_the_healthy_verdict() -> None:
    record = make_record(make_steps(100, 0.1, 0.05), loaders=[make_loader(0)])
    findings = diagnose_run(record)
    assert "run.healthy" not in [f.id for f in findings]
    assert findings[0].severity is Severity.ERROR


def test_an_open_question_about_much_time_is_not_called_healthy() -> None:
    # Half of each step outside forward/backward and no stack sample says on what: not
    # known, so information - and not "healthy" either.
    (f,) = diagnose_run(make_record(make_steps(100, 0.1, 0.05)))
    assert (f.id, f.severity) == ("host.unexplained", Severity.INFO)
    assert f.evidence["settled"] is False and "no stack sample" in f.fix
    # with a few samples, it says how much more of the run would settle it
    few = make_record(make_steps(100, 0.1, 0.05), activity=[make_activity(python=5)])
    (f,) = diagnose_run(few)
    assert (f.id, f.severity) == ("host.unexplained", Severity.INFO)
    assert "5 stack samples (of the 20 needed)" in f.title and "settles it" in f.fix


def test_empty_and_tiny_records_say_there_is_too_little_to_judge() -> None:
    for record in (make_record(), make_record(make_steps(4, 0.1, 0.09))):
        (f,) = diagnose_run(record)
        assert f.id == "run.no_steps" and f.severity is Severity.INFO


def test_every_rule_is_pure_and_tolerates_an_empty_record() -> None:
    from trainmedic.diagnose.thresholds import Thresholds
    from trainmedic.diagnose.view import RunView

    view = RunView.of(make_record())
    for rule in RULES:
        assert list(rule(view, Thresholds())) == [], rule.__name__
