"""diagnose_run as a whole: ranking, the true cause first, custom thresholds and rules."""

from __future__ import annotations

from support.builders import make_loader, make_record, make_steps
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.findings.model import Severity

from .canonical import hot_shared_gpu, input_no_workers, input_slow_storage


def test_input_bound_runs_put_the_true_cause_first() -> None:
    assert diagnose_run(input_no_workers())[0].id == "input.workers"
    assert diagnose_run(input_slow_storage())[0].id == "input.io"


def test_findings_are_ranked_by_severity_then_impact() -> None:
    findings = diagnose_run(hot_shared_gpu())
    keys = [(-f.severity.rank, -(f.impact or -1.0)) for f in findings]
    assert keys == sorted(keys)
    assert {f.id for f in findings} == {
        "model.no_mixed_precision",
        "thermal.throttle.hw_thermal",
        "contention.gpu_process",
    }


def test_thresholds_are_injectable() -> None:
    record = make_record(make_steps(100, 0.1, 0.015), loaders=[make_loader(0)])  # 15 % wait
    assert diagnose_run(record)[0].id == "run.healthy"
    strict = Thresholds(data_wait_warning_share=0.10)
    assert diagnose_run(record, thresholds=strict)[0].severity is Severity.WARNING


def test_rules_are_injectable() -> None:
    record = make_record(make_steps(100, 0.1, 0.05))
    assert [f.id for f in diagnose_run(record, rules=())] == ["run.healthy"]


def test_random_records_never_break_the_rules() -> None:
    """Odd but valid records (zero durations, gaps, several pids, missing readings)."""
    import json
    import random

    from support.builders import (
        during,
        make_activity,
        make_gpu_series,
        make_host_series,
        make_loader,
    )
    from trainmedic.findings.model import FindingsDocument
    from trainmedic.gpu.types import ClockEventReason
    from trainmedic.record.stats import summarize

    rng = random.Random(7)
    for _ in range(40):
        n = rng.choice([0, 1, 3, 8, 60])
        steps = []
        for pid in range(1, rng.randint(1, 3) + 1):
            durations = [rng.choice([0.0, 0.01, 0.1, 0.1, 2.5, 30.0]) for _ in range(n)]
            steps += make_steps(
                n,
                durations=durations,
                wait=rng.choice([0.0, 0.05, 1.0]),
                pid=pid,
                gpu_time=rng.choice([None, 0.05]),
                autocast=rng.choice([None, False, True]),
            )
        gpu = make_gpu_series(
            rng.randint(0, 20),
            utilization_gpu_pct=rng.choice([None, 0.0, 60.0]),
            memory_used_bytes=rng.choice([None, 0, 79 << 30]),
        )
        if gpu:
            gpu = during(
                gpu,
                gpu[0].timestamp,
                gpu[-1].timestamp,
                clock_event_reasons=int(rng.choice(list(ClockEventReason))),
            )
        host = make_host_series(
            rng.randint(0, 20),
            usable_cores=rng.choice([0.0, 1.0, 16.0]),
            iowait_pct=None,
            others_cpu_pct=rng.choice([None, 3000.0]),
        )
        record = make_record(
            steps,
            gpu=gpu,
            host=host,
            loaders=[make_loader(rng.choice([0, 4]))] if rng.random() < 0.5 else [],
            activity=[make_activity(file_read=rng.randint(0, 50))],
        )
        findings = diagnose_run(record)
        assert findings, "every diagnosis says at least something"
        json.dumps(FindingsDocument.build("run", findings, 0.0).to_dict())
        json.dumps(summarize(record).to_dict())
