"""The Chrome trace: valid Trace Event Format, steps with nested slices, instants, counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import builders
from trainmedic.record.types import (
    RunEvent,
    RunRecord,
    StepRecord,
    StepWindow,
)
from trainmedic.report.trace import GPU_PID, HOST_PID, RUN_PID, write_chrome_trace

T0 = 1_700_000_000.0


def make_record() -> RunRecord:
    return builders.make_record(
        ended_at=None,
        steps=[
            StepRecord(1, T0 + 1.0, 0.5, data_wait_s=0.2, compute_s=0.25, pid=11, rank=0),
            StepRecord(2, T0 + 1.5, 0.5, data_wait_s=0.0, compute_s=None, pid=11, rank=0),
            StepRecord(1, T0 + 1.2, 0.6, data_wait_s=0.1, pid=12, rank=1, phase="eval"),
        ],
        windows=[
            StepWindow(
                t_start=T0 + 2.0,
                t=T0 + 12.0,
                count=20,
                first_step=3,
                last_step=22,
                duration_sum_s=10.0,
                duration_min_s=0.4,
                duration_max_s=0.7,
                data_wait_sum_s=2.0,
                pid=11,
            )
        ],
        gpu=[
            builders.make_gpu(T0 + s, memory_used_bytes=2 * 1024**3, utilization_gpu_pct=90.0)
            for s in range(3)
        ],
        host=[builders.make_host(T0 + 1, job_cpu_pct=250.0, others_cpu_pct=None)],
        events=[
            RunEvent(T0 + 5.0, "stall", "no step for 60 s", pid=11, data={"waited_s": 60}),
            RunEvent(T0 + 6.0, "restart", "attempt 2", pid=None),
        ],
    )


@pytest.fixture
def trace(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "trace.json"
    write_chrome_trace(make_record(), path)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_structure_is_valid_trace_event_format(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] in {"X", "i", "C", "M"}
        assert isinstance(e["pid"], int)
        assert isinstance(e["name"], str)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert "tid" in e
        if e["ph"] == "i":
            assert e["s"] in {"g", "p", "t"}
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())


def test_steps_have_nested_data_wait_and_compute(trace: dict[str, Any]) -> None:
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 11]
    step1 = next(e for e in slices if e["name"] == "step 1")
    assert step1["ts"] == pytest.approx(500_000)  # started 0.5 s after the run, in µs
    assert step1["dur"] == pytest.approx(500_000)
    wait = next(e for e in slices if e["name"] == "data wait")
    compute = next(e for e in slices if e["name"] == "compute")
    assert (wait["ts"], wait["dur"]) == (pytest.approx(500_000), pytest.approx(200_000))
    assert compute["ts"] == pytest.approx(700_000)
    assert compute["dur"] == pytest.approx(250_000)
    for child in (wait, compute):  # fully inside the step, so viewers nest them
        assert step1["ts"] <= child["ts"]
        assert child["ts"] + child["dur"] <= step1["ts"] + step1["dur"] + 1e-6
    # Step 2 had no data wait and no compute time: no empty sub-slices.
    assert [e["name"] for e in slices].count("data wait") == 1
    window = next(e for e in slices if e["cat"] == "window")
    assert window["name"] == "20 steps"
    assert window["dur"] == pytest.approx(10_000_000)
    assert window["args"]["mean_ms"] == pytest.approx(500.0)


def test_other_phases_and_processes_are_named(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names[11] == "pid 11 (rank 0)"
    assert names[12] == "pid 12 (rank 1)"
    assert names[GPU_PID] == "GPUs" and names[HOST_PID] == "host" and names[RUN_PID] == "run"
    assert any(e["ph"] == "X" and e["name"] == "eval 1" and e["pid"] == 12 for e in events)


def test_events_are_instants_and_samples_counters(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    stall = next(e for e in events if e["ph"] == "i" and e["name"] == "stall")
    assert (stall["pid"], stall["s"], stall["ts"]) == (11, "p", pytest.approx(5_000_000))
    assert stall["args"] == {"message": "no step for 60 s", "data": {"waited_s": 60}}
    restart = next(e for e in events if e["ph"] == "i" and e["name"] == "restart")
    assert (restart["pid"], restart["s"]) == (RUN_PID, "g")
    util = [e for e in events if e["ph"] == "C" and e["name"] == "gpu0 utilization"]
    memory = [e for e in events if e["ph"] == "C" and e["name"] == "gpu0 memory used"]
    assert [e["args"]["percent"] for e in util] == [90.0, 90.0, 90.0]
    assert memory[0]["args"] == {"GiB": 2.0}
    cpu = next(e for e in events if e["ph"] == "C" and e["name"] == "CPU cores")
    assert cpu["args"] == {"job": 2.5}


def test_empty_record_is_still_a_valid_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write_chrome_trace(RunRecord(meta=make_record().meta), path)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"M"}
