"""``trainmedic run`` end to end on a real GPU: a GPU series, the job on its GPU, no sampler error.

Run by scripts/gpu-check; skipped without a GPU (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainmedic.gpu.types import GpuSample
from trainmedic.record.reader import load_run_record

pytestmark = pytest.mark.gpu

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_run_records_gpu_readings_and_step_gpu_time(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # GPU-bound for a few seconds, so the 1 s GPU sampler sees it busy.
    job = [sys.executable, str(SCRIPTS / "cuda_loop.py"), "4000", "sync"]
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(run_dir),
         "--", *job],
        capture_output=True, text=True, timeout=400, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["gpu_backend"] == "nvml"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    problems = [e for e in events if e["kind"] in ("sampler_error", "probe_error")]
    assert problems == []
    gpu = [json.loads(line) for line in (run_dir / "gpu.jsonl").read_text().splitlines()]
    assert len(gpu) >= 2
    first = gpu[0]
    assert first["nm"] and first["id"].startswith(("GPU-", "MIG-")) and first.get("pci")
    busy = [g["ug"] for g in gpu if g.get("ug") is not None]
    assert busy and max(busy) > 30  # the job kept the GPU busy
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert any(s.get("g") for s in steps), "no step carried GPU time"
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    assert_hardware_findings_match_the_readings(findings, load_run_record(run_dir).gpu)


def assert_hardware_findings_match_the_readings(
    findings: list[dict[str, Any]], samples: list[GpuSample]
) -> None:
    """A finding about the machine (a row remap pending, an ECC error, an Xid) is the
    machine's state, not trainmedic's: the run test accepts it, but it must name a GPU
    the run read and agree with that GPU's readings."""
    series: dict[str, list[GpuSample]] = {}
    for g in samples:
        series.setdefault(f"gpu{g.index}", []).append(g)
    for f in findings:
        if f["category"] != "hardware_fault":
            continue
        print(f"the machine: {f['severity']} {f['id']}: {f['title']}")
        assert f["fix"] and f["severity"] in ("warning", "error"), f
        if not f["id"].startswith("hardware.xid."):  # an Xid may name a bus id, or no GPU
            assert f["subject"] in series, (f, sorted(series))
        read = series.get(f["subject"], [])
        if f["id"] == "hardware.memory_repair_pending":
            pending = any(g.remapped_rows.pending for g in read)
            retired = any(g.retired_pages_pending for g in read)
            assert (pending, retired) == (
                f["evidence"]["remapped_rows_pending"],
                f["evidence"]["retired_pages_pending"],
            ), f
            assert pending or retired, f
        elif f["id"] == "hardware.row_remap_failure":
            assert any(g.remapped_rows.failure for g in read), f
        elif f["id"] == "hardware.ecc_uncorrected":
            ecc = [g.ecc.volatile_uncorrected for g in read]
            counts = [n for n in ecc if n is not None]
            assert counts and max(counts) > counts[0], f


def test_a_live_window_names_the_item_each_step_and_the_pageable_copies(tmp_path: Path) -> None:
    """The profiler window of a CUDA job (on by default) finds what a trace shows: the
    ``.item()`` in ``train_step`` every step and batches copied from pageable memory."""
    run_dir, events = run_events(tmp_path, ["item_and_pageable.py", "200", "cuda"], 300)
    windows = [e for e in events if e["kind"] == "profile_window"]
    assert windows and windows[0]["data"]["cuda"] is True, windows
    document = json.loads((run_dir / "findings.json").read_text())
    (context,) = document["context"]["profile_windows"]
    assert context["gpu_busy_share"] is not None and context["steps"] >= 1
    found = {f["id"]: f for f in document["findings"]}
    sync = found.get("gpu.host_sync")
    assert sync is not None, sorted(found)
    assert "item_and_pageable.py" in json.dumps(sync["evidence"]) and "train_step" in json.dumps(
        sync["evidence"]
    )
    assert "gpu.pageable_copies" in found, sorted(found)
    assert str(found["gpu.pageable_copies"]["evidence"]["profile"]).startswith("profiles/")


def test_a_cuda_jobs_waits_and_its_pin_memory_thread_are_sampled_from_outside(
    tmp_path: Path,
) -> None:
    run_dir, events = run_events(tmp_path, ["cuda_pinned_loader.py", "300"], 400)
    outside = [e["data"] for e in events if e["kind"] == "stacks_outside"]
    assert [d["state"] for d in outside] == ["outside", "usage"], outside
    activity = [
        json.loads(line) for line in (run_dir / "loader_activity.jsonl").read_text().splitlines()
    ]
    pid = next(e["pid"] for e in events if e["kind"] == "stacks_outside")
    mine = [a["counts"] for a in activity if a["pid"] == pid]
    assert outside[-1]["wait_samples"] >= 20
    # The training thread waited on its worker; at the same moments the pin-memory thread
    # waited for work: "idle" is a state only a loading thread's samples have.
    assert sum(c.get("ipc_wait", 0) for c in mine) >= 10
    assert sum(c.get("idle", 0) for c in mine) >= 10


def run_events(tmp_path: Path, script: list[str], timeout_s: int) -> tuple[Path, list[Any]]:
    """``trainmedic run`` of a script of ``tests/scripts`` (with its arguments): the run
    directory and its events, once it exited 0."""
    run_dir = tmp_path / "run"
    job = [sys.executable, str(SCRIPTS / script[0]), *script[1:]]
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(run_dir),
         "--", *job],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return run_dir, events
