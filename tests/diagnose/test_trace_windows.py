"""A run's profiler windows read back (trainmedic.traces.windows) and joined to its
diagnosis (trainmedic.diagnose.trace_windows, diagnose_run(windows=...))."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from tests.traces.events import item_each_step, x

from support.builders import (
    GIB,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.trace_windows import window_findings
from trainmedic.record.layout import PROFILES_DIR
from trainmedic.traces.windows import MAX_TRACES, read_window_traces


def _write(run_dir: Path, name: str, events: list[dict[str, Any]]) -> Path:
    folder = run_dir / PROFILES_DIR
    folder.mkdir(exist_ok=True)
    path = folder / name
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def _cpu_only(steps: int = 3) -> list[dict[str, Any]]:
    return [x("user_annotation", f"ProfilerStep#{n}", 1000 * n, 1000) for n in range(steps)]


def test_window_traces_are_read_in_step_order_and_bad_ones_named(tmp_path: Path) -> None:
    _write(tmp_path, "pid7-step500.json.gz", item_each_step())
    _write(tmp_path, "pid7-step30.json.gz", item_each_step())
    (tmp_path / PROFILES_DIR / "pid7-step900.json.gz").write_bytes(b"\x1f\x8bnot gzip")
    (tmp_path / PROFILES_DIR / "notes.txt").write_text("not a window's")
    (tmp_path / PROFILES_DIR / ".pid7-step1200.json.gz.7.tmp.gz").write_bytes(b"")
    got = read_window_traces(tmp_path)
    assert [(w.pid, w.after_step, len(w.summary.steps)) for w in got.traces] == [
        (7, 30, 3), (7, 500, 3)]  # fmt: skip
    (problem,) = got.problems
    assert "pid7-step900.json.gz" in problem


def test_a_run_without_windows_has_none(tmp_path: Path) -> None:
    got = read_window_traces(tmp_path)
    assert got.traces == () and got.problems == ()


def test_the_latest_windows_are_read_when_there_are_too_many(tmp_path: Path) -> None:
    for n in range(MAX_TRACES + 2):
        _write(tmp_path, f"pid1-step{100 * n}.json.gz", _cpu_only(1))
    got = read_window_traces(tmp_path)
    assert len(got.traces) == MAX_TRACES and got.traces[0].after_step == 200
    assert got.problems == ("2 older window trace(s) left out",)


def test_a_cause_in_two_windows_is_one_finding_with_its_costliest_window(
    tmp_path: Path,
) -> None:
    _write(tmp_path, "pid7-step30.json.gz", item_each_step())
    _write(tmp_path, "pid7-step500.json.gz", item_each_step(5))
    _write(tmp_path, "pid7-step900.json.gz", _cpu_only())  # no GPU work: judged by nothing
    found = window_findings(read_window_traces(tmp_path).traces)
    (sync,) = [f for f in found if f.id == "gpu.host_sync"]
    assert sync.evidence["profile_windows"] == 2
    assert sync.evidence["profile_windows_with_it"] == 2
    assert str(sync.evidence["profile"]).startswith("profiles/pid7-step")
    assert len({f.id for f in found}) == len(found)  # one finding a cause
    assert "gpu.waits_for_data" not in {f.id for f in found}


def test_a_window_that_names_the_sync_replaces_the_runs_host_overhead(tmp_path: Path) -> None:
    # The GPU 30 % busy on 50 ms steps of a big batch, little data wait: host overhead.
    record = make_record(
        make_steps(100, 0.05, 0.005, samples=256, compute=0.04),
        gpu=make_gpu_series(6, utilization_gpu_pct=30.0, memory_used_bytes=50 * GIB),
        host=make_host_series(6),
        loaders=[make_loader(8, batch_size=256)],
    )
    plain = {f.id for f in diagnose_run(record)}
    assert "gpu.host_overhead" in plain
    _write(tmp_path, "pid7-step30.json.gz", item_each_step())
    joined = {f.id for f in diagnose_run(record, windows=read_window_traces(tmp_path).traces)}
    assert "gpu.host_sync" in joined and "gpu.host_overhead" not in joined
    assert "run.healthy" not in joined
