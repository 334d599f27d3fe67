"""The run record on disk: round trips, atomic meta, damage, permissions, bounding, threads."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from support import builders
from trainmedic.errors import RunDirectoryError
from trainmedic.gpu.types import EccCounts, GpuSample, PcieLink, RemappedRows
from trainmedic.record import store as store_module
from trainmedic.record.store import (
    CAPPED_EVENT,
    LINE_FILES,
    RetentionPolicy,
    RunRecordWriter,
    load_run_record,
)
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunEvent,
    RunMeta,
    StepRecord,
)

T0 = 1_700_000_000.0
MB = 1_000_000


def make_meta(**kw: object) -> RunMeta:
    base = RunMeta(
        run_id="20240101-000000-abcd",
        command=("python", "train.py", "--lr", "0.1"),
        cwd="/home/me/proj",
        started_at=T0,
        trainmedic_version="0.1.0",
        gpu_backend="simulated",
        environment={"gpus": [{"name": "H100"}], "cores": 16},
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def make_step(step: int, t: float, duration: float = 0.01, **kw: object) -> StepRecord:
    return StepRecord(step=step, t=t, duration_s=duration, **kw)  # type: ignore[arg-type]


def make_full_step() -> StepRecord:
    return StepRecord(
        step=7,
        t=T0 + 1.234567,
        duration_s=0.25,
        data_wait_s=0.125,
        compute_s=0.0625,
        gpu_time_s=0.05,
        samples=64,
        source="api",
        phase="eval",
        pid=4242,
        rank=3,
        alloc_peak_bytes=12_345_678_901,
        reserved_peak_bytes=23_456_789_012,
        alloc_retries=2,
        ooms=1,
        autocast=True,
    )


def make_gpu(t: float, index: int = 0, util: float = 97.5, **kw: object) -> GpuSample:
    """A reading with every field set, so a round trip covers the whole codec."""
    fields: dict[str, object] = {
        "utilization_gpu_pct": util,
        "ecc": EccCounts(0, 0, 1, 0),
        "retired_pages_pending": False,
        "remapped_rows": RemappedRows(0, 0, False, False),
        "pcie": PcieLink(5, 5, 5, 16, 16, 1234, 5678),
        "persistence_mode": True,
        **kw,
    }
    return builders.make_gpu(t, index=index, **fields)


def make_host(t: float, **kw: object) -> HostSample:
    """A reading with every field set, so a round trip covers the whole codec."""
    fields: dict[str, object] = {
        "net_recv_bytes_per_s": None,  # a counter the host could not read
        "net_sent_bytes_per_s": 42.0,  # rates are stored in whole bytes per second
        "cgroup_throttled_s": 0.5,
        "steal_pct": 0.4,
        "train_threads": 8,
        "train_cpu_cores": 7.912,
        "train_wait_cores": 0.123,
        "train_wait_max_share": 0.031,
        "helper_cpu_cores": 3.333,
        "helper_wait_cores": 0.245,
        "loader_cpu_cores": 11.875,
        "loader_wait_cores": 1.234,
        "job_wait_cores": 1.602,
        "job_threads": 412,
        **kw,
    }
    return builders.make_host(t, **fields)


def make_busy_gpu(second: int, index: int) -> GpuSample:
    """A reading where every fast-moving field differs from the second before."""
    return make_gpu(
        T0 + second,
        index,
        util=float((second * 7 + index) % 100) + 0.5,
        memory_used_bytes=60_000_000_000 + (second * 7_919) % 10_000_000_000,
        utilization_memory_pct=float(second % 90) + 0.5,
        temperature_c=float(60 + second % 25),
        power_draw_w=400.5 + second % 300,
        sm_clock_mhz=float(1600 + second % 380),
        pcie=PcieLink(5, 5, 5, 16, 16, 100_000 + second * 13, 2_000_000 + second * 17),
    )


def make_busy_host(second: int) -> HostSample:
    return make_host(
        T0 + second,
        job_cpu_pct=400.5 + second % 800,
        job_rss_bytes=8_000_000_000 + second * 4096,
        system_cpu_pct=float(second % 100) + 0.5,
        iowait_pct=float(second % 10) + 0.5,
        disk_read_bytes_per_s=123_456_789.0 + second * 1_013,
        disk_write_bytes_per_s=1_000_000.0 + second * 7,
        net_recv_bytes_per_s=987_654_321.0 + second * 11,
        net_sent_bytes_per_s=12_345_678.0 + second,
        mem_available_bytes=100_000_000_000 - second * 4096,
        others_cpu_pct=float(second % 50) + 0.5,
    )


def make_loader() -> LoaderInfo:
    return LoaderInfo(
        t=T0 + 0.5,
        pid=4242,
        loader_id=1,
        num_workers=0,
        batch_size=64,
        pin_memory=False,
        prefetch_factor=None,
        persistent_workers=False,
        dataset_type="ImageFolder",
        dataset_len=1_281_167,
    )


def make_activity() -> LoaderActivity:
    return LoaderActivity(
        t=T0 + 2.0,
        pid=4242,
        counts={"transform": 40, "file_read": 55, "idle": 5},
        top_frames={"PIL/Image.py:1234 decode": 30, "dataset.py:20 __getitem__": 12},
        handoff={"waits": 12, "thread:socket": 40, "process:cpu": 3, "in_flight": 40},
        helper_frames={"socket.py:706 readinto < train.py:54 get": 40},
    )


def make_event(**kw: object) -> RunEvent:
    base = RunEvent(
        t=T0 + 3.0,
        kind="exception",
        message="RuntimeError: CUDA out of memory",
        pid=4242,
        data={"traceback": "Traceback ...\nRuntimeError: CUDA out of memory", "step": 12},
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def steady_steps(count: int, pid: int = 1, start: float = T0, first: int = 1) -> list[StepRecord]:
    """``count`` ordinary steps of 10 ms with a 1 ms data wait and a little jitter."""
    out, t = [], start
    for i in range(count):
        d = round(0.01 + (i % 5) * 0.0001, 6)
        t = round(t + d, 6)  # what the store keeps: microseconds
        out.append(make_step(first + i, t, d, data_wait_s=0.001, pid=pid, samples=32))
    return out


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "r1"


# --- round trips -----------------------------------------------------------------------


def test_every_record_type_round_trips(run_dir: Path) -> None:
    meta = make_meta()
    steps = [make_full_step(), make_step(1, T0 + 0.01), make_step(2, T0 + 0.02, pid=5, rank=0)]
    gpus = [
        make_gpu(T0 + 1, 0),
        make_gpu(T0 + 1, 1, util=0.0, processes=()),
        make_gpu(T0 + 2, 0, util=50.0, clock_event_reasons=0x40, processes=()),
        # A reading that became unknown must come back as unknown, not as the old value.
        make_gpu(T0 + 3, 0, util=None, pcie=PcieLink(4, 5, 5, 16, 16, None, None)),
    ]
    hosts = [make_host(T0 + 1), make_host(T0 + 2, iowait_pct=None, others_cpu_pct=None)]
    with RunRecordWriter(run_dir) as w:
        w.write_meta(meta)
        for s in steps:
            w.add_step(s)
        for g in gpus:
            w.add_gpu(g)
        for h in hosts:
            w.add_host(h)
        w.add_loader(make_loader())
        w.add_loader_activity(make_activity())
        w.add_event(make_event())
        w.add_event(make_event(pid=None, data={}, kind="hang_detected", message="no step for 60 s"))
    record = load_run_record(run_dir)
    assert record.meta == meta
    assert record.steps == sorted(steps, key=lambda s: s.t)
    assert record.windows == []
    assert record.gpu == gpus
    assert record.host == hosts
    assert record.loaders == [make_loader()]
    assert record.loader_activity == [make_activity()]
    assert [e.kind for e in record.events] == ["exception", "hang_detected"]
    assert record.events[0] == make_event()


def test_gpu_lines_carry_only_changes(run_dir: Path) -> None:
    with RunRecordWriter(run_dir) as w:
        w.write_meta(make_meta())
        w.add_gpu(make_gpu(T0 + 1))
        w.add_gpu(make_gpu(T0 + 2, util=12.0))
    first, second = (json.loads(line) for line in (run_dir / "gpu.jsonl").read_text().splitlines())
    assert first["nm"] == "NVIDIA H100 80GB HBM3"
    assert set(second) == {"t", "i", "ug"}
    assert second["ug"] == 12


def test_meta_is_replaced_atomically(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = RunRecordWriter(run_dir)
    w.write_meta(make_meta())
    w.write_meta(make_meta(ended_at=T0 + 60, exit_code=0))
    assert load_run_record(run_dir).meta.exit_code == 0

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module.os, "replace", failing_replace)
    with pytest.raises(OSError):
        w.write_meta(make_meta(ended_at=T0 + 99, exit_code=1))
    # The old meta survives whole, and no temp file is left behind.
    assert load_run_record(run_dir).meta.exit_code == 0
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([*LINE_FILES, "meta.json"])
    w.close()


def test_meta_written_after_close(run_dir: Path) -> None:
    w = RunRecordWriter(run_dir)
    w.write_meta(make_meta())
    w.add_step(make_step(1, T0 + 1))
    w.close()
    w.add_step(make_step(2, T0 + 2))  # late sampler: ignored, not an error
    w.write_meta(make_meta(ended_at=T0 + 5, exit_code=-9))
    record = load_run_record(run_dir)
    assert record.meta.exit_code == -9
    assert [s.step for s in record.steps] == [1]


# --- damage ----------------------------------------------------------------------------


def write_small_run(run_dir: Path, steps: int = 3) -> None:
    with RunRecordWriter(run_dir) as w:
        w.write_meta(make_meta())
        for s in steady_steps(steps):
            w.add_step(s)


def test_truncated_last_line_is_skipped(run_dir: Path) -> None:
    write_small_run(run_dir)
    path = run_dir / "steps.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-9])  # cut inside the third line, as a crash would
    assert [s.step for s in load_run_record(run_dir).steps] == [1, 2]


def test_reopening_after_a_crash_drops_the_partial_line(run_dir: Path) -> None:
    write_small_run(run_dir)
    path = run_dir / "steps.jsonl"
    path.write_bytes(path.read_bytes()[:-9])
    with RunRecordWriter(run_dir) as w:
        w.add_step(make_step(9, T0 + 9))
    assert [s.step for s in load_run_record(run_dir).steps] == [1, 2, 9]
    # A last record that is whole but lacks its newline is kept.
    path.write_bytes(path.read_bytes()[:-1])
    with RunRecordWriter(run_dir) as w:
        w.add_step(make_step(10, T0 + 10))
    assert [s.step for s in load_run_record(run_dir).steps] == [1, 2, 9, 10]


def test_corrupt_middle_line_names_file_and_line(run_dir: Path) -> None:
    write_small_run(run_dir)
    path = run_dir / "steps.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = '{"s": 2, "t": 17\n'
    path.write_text("".join(lines))
    with pytest.raises(RunDirectoryError, match=r"steps\.jsonl:2: malformed record"):
        load_run_record(run_dir)


def test_complete_but_invalid_last_line_is_an_error(run_dir: Path) -> None:
    write_small_run(run_dir)
    with (run_dir / "host.jsonl").open("a") as f:
        f.write('{"t": 1}\n')
    with pytest.raises(RunDirectoryError, match=r"host\.jsonl:1: .*missing field 'jc'"):
        load_run_record(run_dir)


def test_bad_directories_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="does not exist") as missing:
        load_run_record(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(missing.value)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(RunDirectoryError, match="is not a directory"):
        load_run_record(a_file)
    with pytest.raises(RunDirectoryError, match=r"not a run directory \(no meta.json\)"):
        load_run_record(tmp_path)
    (tmp_path / "meta.json").write_text('{"run_id": "x"}')
    with pytest.raises(RunDirectoryError, match=r"meta.json: malformed run metadata: .*command"):
        load_run_record(tmp_path)
    (tmp_path / "meta.json").write_text("{")
    with pytest.raises(RunDirectoryError, match="malformed run metadata") as bad:
        load_run_record(tmp_path)
    assert "\n" not in str(bad.value)


# --- permissions -----------------------------------------------------------------------


def test_directory_and_files_are_private(run_dir: Path) -> None:
    old = os.umask(0o022)
    try:
        with RunRecordWriter(run_dir) as w:
            w.write_meta(make_meta())
            w.add_step(make_step(1, T0))
    finally:
        os.umask(old)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir()}
    assert modes == dict.fromkeys([*LINE_FILES, "meta.json"], 0o600)


def test_writer_refuses_a_file_as_run_dir(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("mine")
    with pytest.raises(RunDirectoryError, match="not a directory"):
        RunRecordWriter(target)


# --- bounding --------------------------------------------------------------------------


def test_head_is_exact_then_ordinary_steps_fold_into_windows(run_dir: Path) -> None:
    policy = RetentionPolicy(head_steps=50, window_max_steps=100, window_max_s=1e9)
    steps = steady_steps(1050)
    with RunRecordWriter(run_dir, policy) as w:
        w.write_meta(make_meta())
        for s in steps:
            w.add_step(s)
    record = load_run_record(run_dir)
    assert record.steps == steps[:50]
    assert [w.count for w in record.windows] == [100] * 10
    first = record.windows[0]
    assert (first.first_step, first.last_step) == (51, 150)
    folded = steps[50:150]
    assert first.duration_sum_s == pytest.approx(sum(s.duration_s for s in folded), abs=1e-6)
    assert first.duration_max_s == pytest.approx(max(s.duration_s for s in folded))
    assert first.data_wait_sum_s == pytest.approx(0.1, abs=1e-6)
    assert first.samples_sum == 3200
    assert first.t_start == pytest.approx(steps[49].t, abs=1e-6)


def test_windows_close_after_window_max_s(run_dir: Path) -> None:
    policy = RetentionPolicy(head_steps=20, window_max_steps=10_000, window_max_s=1.0)
    with RunRecordWriter(run_dir, policy) as w:
        w.write_meta(make_meta())
        for s in steady_steps(520):
            w.add_step(s)
    windows = load_run_record(run_dir).windows
    assert len(windows) == 6  # 500 steps of ~10 ms: five whole seconds and a rest
    assert all(w.t - w.t_start <= 1.0 + 1e-6 for w in windows)


def stream_with_anomalies(
    count: int, pid: int = 1, start: float = T0
) -> Iterator[tuple[StepRecord, bool]]:
    """A steady stream with injected anomalies of every kind; yields (step, is_anomaly)."""
    t = start
    retries = 0
    for i in range(count):
        n = i + 1
        d, wait, phase, anomaly = 0.01 + (i % 7) * 0.0001, 0.001, "train", False
        if n % 997 == 0:
            d, anomaly = 0.05, True  # 5x slower
        elif n % 1499 == 0:
            d, wait, anomaly = 0.016, 0.007, True  # data wait spike
        elif n % 2003 == 0:
            retries += 1
            anomaly = True
        elif n % 50_000 < 3:
            phase, d, anomaly = "checkpoint", 2.5, True
        t += d
        step = StepRecord(
            step=n,
            t=round(t, 6),
            duration_s=round(d, 6),
            data_wait_s=wait,
            samples=32,
            pid=pid,
            phase=phase,
            alloc_retries=retries,
        )
        yield step, anomaly


def test_every_anomaly_is_kept_exactly(run_dir: Path) -> None:
    head = 2000
    total = 60_000
    kept: list[StepRecord] = []
    with RunRecordWriter(run_dir, RetentionPolicy(head_steps=head)) as w:
        w.write_meta(make_meta())
        for step, anomaly in stream_with_anomalies(total):
            w.add_step(step)
            if anomaly or step.step <= head:
                kept.append(step)
    record = load_run_record(run_dir)
    exact = {s.step: s for s in record.steps}
    assert all(exact.get(s.step) == s for s in kept)
    # Nothing else is kept exactly except the step after each phase segment
    # (back to "train" is a change too).
    extra = sorted(set(exact) - {s.step for s in kept})
    assert extra == [50_003]
    assert len(record.steps) + sum(w.count for w in record.windows) == total
    assert not [e for e in record.events if e.kind == CAPPED_EVENT]


def test_anomaly_cap_bounds_a_pathological_run(run_dir: Path) -> None:
    policy = RetentionPolicy(head_steps=10, max_exact_steps=100, window_max_steps=50)
    t = T0
    with RunRecordWriter(run_dir, policy) as w:
        w.write_meta(make_meta())
        for i in range(1000):
            d = 0.01 if i < 100 or i % 2 else 1.0  # half the steps 100x slower
            t += d
            w.add_step(make_step(i + 1, t, d))
        counts = w.counts
    record = load_run_record(run_dir)
    assert len(record.steps) == 100
    assert counts.anomalies_dropped > 0
    assert len(record.steps) + sum(w.count for w in record.windows) == 1000
    capped = [e for e in record.events if e.kind == CAPPED_EVENT]
    assert len(capped) == 1
    assert capped[0].data["anomalies_dropped"] == counts.anomalies_dropped


def test_samples_are_decimated_after_full_rate_but_state_changes_kept(run_dir: Path) -> None:
    policy = RetentionPolicy(full_rate_s=100.0, decimated_interval_s=10.0)
    with RunRecordWriter(run_dir, policy) as w:
        w.write_meta(make_meta())
        for second in range(300):
            reasons = 0x40 if second == 250 else 0
            w.add_gpu(make_gpu(T0 + second, clock_event_reasons=reasons))
            w.add_host(make_host(T0 + second))
    record = load_run_record(run_dir)
    host_times = [round(h.t - T0) for h in record.host]
    # Full rate up to 99 s, then every 10 s counted from the last kept sample.
    assert host_times == [*range(100), *range(109, 300, 10)]
    gpu_times = [round(g.timestamp - T0) for g in record.gpu]
    # The clock reason appearing at 250 and going at 251 are both kept.
    assert gpu_times == [*range(100), *range(109, 250, 10), 250, 251, *range(261, 300, 10)]
    assert record.gpu[-1].reasons == 0


def test_events_are_capped_and_long_texts_shortened(run_dir: Path) -> None:
    policy = RetentionPolicy(max_events=5, max_event_text_chars=100)
    with RunRecordWriter(run_dir, policy) as w:
        w.write_meta(make_meta())
        long_tb = "Traceback\n" + "x" * 5000 + "\nValueError: the real cause"
        for i in range(8):
            w.add_event(make_event(t=T0 + i, data={"traceback": long_tb, "obj": object()}))
    events = load_run_record(run_dir).events
    assert len(events) == 6
    assert events[-1].kind == CAPPED_EVENT
    assert events[-1].data["events_dropped"] == 3
    tb = events[0].data["traceback"]
    assert len(tb) == 100
    assert tb.endswith("ValueError: the real cause")
    assert events[0].data["obj"].startswith("<object object")


def line_bytes(path: Path) -> list[int]:
    return [len(line) for line in path.read_bytes().splitlines(keepends=True)]


# A day at 100 steps/s, with 8 GPUs and host readings at 1 Hz.
DAY_S = 24 * 3600
STEPS_PER_S = 100
GPUS = 8
BOUND_BYTES = 100 * MB


def test_day_long_run_bound_from_measured_line_sizes(tmp_path: Path) -> None:
    """Worst-case size of a 24 h run, from the policy's line counts x measured line sizes.

    Every cap is reached in this bound (200k exact steps, the event and loader byte
    caps, a forced GPU sample budget spent on every GPU), so a real day is smaller;
    test_day_long_run_stays_bounded measures one.
    """
    policy = RetentionPolicy()
    run_dir = tmp_path / "r"
    with RunRecordWriter(run_dir, policy) as w:
        w.write_meta(make_meta())
        for step, _ in stream_with_anomalies(40_000):
            w.add_step(step)
        w.add_step(make_full_step())
        for second in range(200):
            for g in range(GPUS):
                w.add_gpu(make_busy_gpu(second, g))
            w.add_host(make_busy_host(second))
    max_step = max(line_bytes(run_dir / "steps.jsonl"))
    max_window = max(line_bytes(run_dir / "windows.jsonl"))
    # Every line after a GPU's first carries only changes; budget the worst ones.
    gpu_lines = line_bytes(run_dir / "gpu.jsonl")[GPUS:]
    max_gpu = max(gpu_lines) + 40  # room for a changed clock reason / PCIe link
    max_host = max(line_bytes(run_dir / "host.jsonl"))
    steps = DAY_S * STEPS_PER_S
    windows = steps // policy.window_max_steps + int(DAY_S / policy.window_max_s)
    samples_per_stream = int(
        policy.full_rate_s + (DAY_S - policy.full_rate_s) / policy.decimated_interval_s
    )
    bound = (
        policy.max_exact_steps * max_step
        + windows * max_window
        + GPUS * (samples_per_stream + policy.max_forced_gpu_samples) * max_gpu
        + samples_per_stream * max_host
        + policy.max_event_bytes
        + policy.max_loader_activity_bytes
        + policy.max_loaders * 400
    )
    print(f"24 h worst-case bound: {bound / MB:.1f} MB")
    assert bound < BOUND_BYTES


@pytest.mark.slow
def test_day_long_run_stays_bounded(tmp_path: Path) -> None:
    """Feed a whole simulated day (8.64 M steps, 8 GPUs and host at 1 Hz) and measure."""
    run_dir = tmp_path / "day"
    anomalies: list[StepRecord] = []
    steps = iter(stream_with_anomalies(DAY_S * STEPS_PER_S))
    next_second = T0
    with RunRecordWriter(run_dir) as w:
        w.write_meta(make_meta())
        for step, anomaly in steps:
            w.add_step(step)
            if anomaly:
                anomalies.append(step)
            if step.t >= next_second:
                second = int(next_second - T0)
                for g in range(GPUS):
                    w.add_gpu(make_busy_gpu(second, g))
                w.add_host(make_busy_host(second))
                next_second += 1.0
    total = sum(p.stat().st_size for p in run_dir.iterdir())
    print(f"24 h measured record: {total / MB:.2f} MB, {len(anomalies)} anomalies")
    assert total < BOUND_BYTES
    record = load_run_record(run_dir)
    exact = {(s.pid, s.step): s for s in record.steps}
    assert all(exact.get((a.pid, a.step)) == a for a in anomalies)
    assert len(record.steps) + sum(w.count for w in record.windows) == DAY_S * STEPS_PER_S


# --- threads ---------------------------------------------------------------------------


def test_concurrent_writers_lose_nothing(run_dir: Path) -> None:
    per_thread = 3000
    w = RunRecordWriter(run_dir, RetentionPolicy(head_steps=1000, window_max_steps=500))
    w.write_meta(make_meta())
    start = threading.Barrier(4)

    def steps(pid: int) -> None:
        start.wait()
        for s in steady_steps(per_thread, pid=pid):
            w.add_step(s)

    def samples() -> None:
        start.wait()
        for i in range(per_thread):
            w.add_gpu(make_gpu(T0 + i, i % 2))
            w.add_host(make_host(T0 + i))
            if i % 100 == 0:
                w.add_event(make_event(t=T0 + i))
                w.flush()

    threads = [threading.Thread(target=steps, args=(pid,)) for pid in (1, 2, 3)]
    threads.append(threading.Thread(target=samples))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    w.close()
    record = load_run_record(run_dir)
    for pid in (1, 2, 3):
        exact = [s for s in record.steps if s.pid == pid]
        folded = sum(x.count for x in record.windows if x.pid == pid)
        assert len(exact) == 1000
        assert len(exact) + folded == per_thread
    assert len(record.gpu) == per_thread
    assert len(record.host) == per_thread
    assert len(record.events) == per_thread // 100
