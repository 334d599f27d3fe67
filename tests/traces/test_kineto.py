"""torch.profiler traces read into steps and GPU busy time (trainmedic.traces.kineto), checked
against an independent count of each trace's events."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from tests.traces.events import item_each_step, x

from trainmedic.demo.traces import DEMO_TRACE
from trainmedic.traces.kineto import TraceError, read_trace

DATA = Path(__file__).resolve().parent / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "gpu-traces"
BUNDLED = ["a100-alexnet.json.gz", "sampled-rank0.json.gz"]
SHARED_ONLY = ["a100-control.json.gz", "v100-ddp-rank0.json.gz"]


def trace_path(name: str) -> Path:
    if name == DEMO_TRACE.name:
        return DEMO_TRACE
    path = DATA / name if (DATA / name).exists() else SHARED / name
    if not path.exists():
        pytest.skip(f"{name}: the shared GPU traces are not beside this checkout")
    return path


def independent(path: Path) -> dict[str, Any]:
    """Steps and the main device's busy share, counted from the whole document at once,
    by a sweep over interval edges (no code shared with the reader)."""
    with gzip.open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = sorted(
        (e["ts"], e["dur"]) for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") in ("user_annotation", "cpu_op")
    )  # fmt: skip
    steps = [(ts, ts + dur) for ts, dur in spans]
    gpu: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            d = e.get("args", {}).get("device", 0)
            gpu.setdefault(d, []).append((e["ts"], e["ts"] + e.get("dur", 0)))
    main = max(gpu, key=lambda d: sum(b - a for a, b in gpu[d])) if gpu else None
    shares = []
    for lo, hi in steps:
        # +1 where an interval starts, -1 where it ends, clipped to the step: time with a
        # count above zero is busy.
        edges = sorted(
            (t, d) for a, b in gpu.get(main, []) if b > lo and a < hi  # type: ignore[arg-type]
            for t, d in ((max(a, lo), 1), (min(b, hi), -1))
        )
        busy, depth, last = 0.0, 0, lo
        for t, d in edges:
            if depth > 0:
                busy += t - last
            depth, last = depth + d, t
        shares.append(busy / (hi - lo))
    return {
        "events": len(events),
        "steps": len(steps),
        "median_s": statistics.median(d for _, d in spans) / 1e6 if spans else None,
        "busy": statistics.median(shares) if shares else None,
        "kernels": sum(1 for e in events if e.get("cat") == "kernel"),
    }


@pytest.mark.parametrize("name", BUNDLED + SHARED_ONLY)
def test_steps_step_time_and_gpu_busy_match_an_independent_count(name: str) -> None:
    path = trace_path(name)
    got = read_trace(path)
    want = independent(path)
    assert got.events == want["events"] and got.kernels == want["kernels"]
    assert len(got.steps) == want["steps"]
    if want["steps"]:
        assert got.step_time_median_s == pytest.approx(want["median_s"], rel=1e-9)
        assert got.gpu_busy_share == pytest.approx(want["busy"], abs=1e-6)
        assert all(0.0 <= s.gpu_busy_share <= 1.0 for s in got.steps)
        assert [s.number for s in got.steps] == sorted(s.number for s in got.steps)
    else:
        assert got.step_time_median_s is None and got.gpu_busy_share is None


def test_what_the_bundled_traces_hold() -> None:
    alexnet = read_trace(trace_path("a100-alexnet.json.gz"))
    assert alexnet.device is not None and alexnet.device.name == "NVIDIA A100-PG509-200"
    assert alexnet.device.compute_capability == "8.0" and alexnet.steps == ()
    assert alexnet.launches == 79  # one cudaLaunchKernel per kernel
    sampled = read_trace(trace_path("sampled-rank0.json.gz"))
    assert (sampled.rank, sampled.world_size) == (0, 128)
    assert [s.number for s in sampled.steps] == [551, 552]
    # Each step launches its kernels and copies from pageable memory (16 HtoD and 8 DtoH
    # over the two steps, as the events name them).
    assert all(s.launches > 500 and s.pageable_copies == 12 for s in sampled.steps)
    assert all(s.nccl_us > 0 for s in sampled.steps)


def test_a_step_with_idle_gaps_between_kernels_on_two_streams(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 100, "dur": 100},
        # two streams overlapping on 110..130, a gap, a copy, one kernel past the step's end
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 110, "dur": 15,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 120, "dur": 10,
         "args": {"device": 0, "stream": 9}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 150,
         "dur": 10, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "ts": 190, "dur": 30,
         "args": {"device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 105, "dur": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 160, "dur": 25},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 230, "dur": 3},
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (step,) = read_trace(path).steps
    assert step.number == 7 and step.dur_us == 100
    assert step.gpu_busy_us == pytest.approx(20 + 10 + 10)  # 110-130, 150-160, 190-200
    assert step.nccl_us == pytest.approx(10) and step.copy_us == pytest.approx(10)
    assert step.exposed_nccl_us == pytest.approx(10)  # nothing else ran meanwhile
    assert step.kernels == 3
    assert (step.launches, step.launch_us, step.syncs, step.sync_us) == (1, 3, 1, 25)
    assert (step.pageable_copies, step.pageable_copy_us) == (1, 10)


def test_progress_is_reported_in_bytes_read(tmp_path: Path) -> None:
    seen: list[int] = []
    path = trace_path("sampled-rank0.json.gz")
    read_trace(path, on_read=seen.append)
    assert seen and seen == sorted(seen) and seen[-1] >= path.stat().st_size


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "not valid JSON"),
        (b"not json at all", "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X", "cat": "kernel"', "not valid JSON"),
        (b'{"schemaVersion": 1}', "no traceEvents"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (json.dumps({"traceEvents": [{"ph": "X", "name": "step", "cat": "steps", "ts": 1}]})
         .encode(), "another tool"),
    ],
)  # fmt: skip
def test_what_is_not_a_trace_is_one_line_naming_why(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=says) as info:
        read_trace(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert "b'" not in str(info.value) and "\\n" not in str(info.value)  # no bytes repr


def test_a_truncated_gzip_and_a_missing_file(tmp_path: Path) -> None:
    whole = trace_path("a100-alexnet.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        read_trace(cut)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.json.gz")


def test_the_array_form_of_a_chrome_trace_is_read(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 2, "dur": 5, "args": {"device": 1}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    summary = read_trace(path)
    assert summary.gpu_busy_share == pytest.approx(0.5)
    assert summary.device is not None and summary.device.index == 1


def test_a_long_kernel_begun_long_before_the_step_counts_where_it_runs(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 100, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "long", "ts": 0, "dur": 150, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 10, "dur": 5, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 60, "dur": 5, "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "c", "ts": 180, "dur": 10, "args": {"device": 0}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (step,) = read_trace(path).steps
    assert step.gpu_busy_us == pytest.approx(50 + 10) and step.kernel_us == pytest.approx(60)


@pytest.mark.parametrize("content", [b"42", b'"traceEvents"', b"[]"])
def test_json_that_holds_no_trace(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=r"no traceEvents|another tool"):
        read_trace(path)


def test_a_sync_each_step_is_traced_to_the_users_call_and_the_gpu_time_it_loses(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": item_each_step()}))
    t = read_trace(path)
    assert t.with_stack and len(t.steps) == 3
    for step in t.steps:
        assert (step.syncs, step.sync_us) == (1, 440)
        assert step.gpu_idle_after_sync_us == pytest.approx(700 - 550)
        assert (step.allocs, step.alloc_us, step.frees, step.free_us) == (1, 30, 1, 20)
    (site,) = t.sync_sites
    assert site.where == "train.py(30): train_step" and site.call == "Tensor.item"
    assert (site.runtime, site.count) == ("cudaStreamSynchronize", 3)
    assert site.host_us == pytest.approx(3 * 440) and site.gpu_idle_us == pytest.approx(3 * 150)


def test_without_python_frames_the_operator_names_the_sync(tmp_path: Path) -> None:
    events = [e for e in item_each_step() if e["cat"] != "python_function"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_trace(path)
    assert not t.with_stack
    (site,) = t.sync_sites
    assert site.where is None and site.call == "aten::item" and site.count == 3


def test_a_sync_another_stream_keeps_busy_loses_no_gpu_time(tmp_path: Path) -> None:
    events = [*item_each_step(1), x("kernel", "other_stream", 500, 300, device=0)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (step,) = read_trace(path).steps
    assert step.gpu_idle_after_sync_us == pytest.approx(0.0)


def test_synchronize_called_through_torch_is_named_as_the_user_called_it(tmp_path: Path) -> None:
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 1000),
        x("python_function", "my_project/loop.py(12): run", 5, 900),
        x("python_function", "torch/cuda/__init__.py(985): synchronize", 10, 300),
        x("python_function", "torch/cuda/__init__.py(500): __enter__", 12, 5),
        x("python_function", "<built-in function _cuda_synchronize>", 20, 280),
        x("cuda_runtime", "cudaDeviceSynchronize", 21, 270),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (site,) = read_trace(path).sync_sites
    assert site.where == "my_project/loop.py(12): run" and site.call == "torch.cuda.synchronize"


def test_the_caching_allocators_peaks_come_from_memory_events(tmp_path: Path) -> None:
    def memory(ts: float, allocated: int, reserved: int, device_type: int = 1) -> dict[str, Any]:
        return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": ts,
                "args": {"Device Type": device_type, "Device Id": 0, "Bytes": 512,
                         "Total Allocated": allocated, "Total Reserved": reserved}}  # fmt: skip

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100),
        memory(1, 1 << 20, 4 << 20), memory(2, 3 << 20, 6 << 20), memory(3, 2 << 20, 6 << 20),
        memory(4, 9 << 30, 10 << 30, device_type=0),  # host memory: not the GPU's
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_trace(path)
    assert (t.peak_allocated_bytes, t.peak_reserved_bytes) == (3 << 20, 6 << 20)


def test_memory_grows_with_the_gpu_work_kept_not_with_the_names_or_the_file(
    tmp_path: Path,
) -> None:
    import tracemalloc

    def trace(n: int) -> Path:
        path = tmp_path / f"big{n}.json.gz"
        with gzip.open(path, "wt") as f:
            f.write('{"traceEvents": [')
            f.write(json.dumps(x("user_annotation", "ProfilerStep#1", 0, 10 * n)))
            for i in range(n):
                name = f"void at::native::vectorized_elementwise_kernel<4, {i}>(...)" * 3
                f.write("," + json.dumps(x("kernel", name, 10 * i, 5, device=0, stream=7)))
                f.write("," + json.dumps(x("cuda_runtime", "cudaLaunchKernel", 10 * i, 2)))
                f.write("," + json.dumps(x("cpu_op", f"aten::op{i}", 10 * i, 3)))
            f.write("]}")
        return path

    peaks = []
    for n in (4_000, 16_000):
        path = trace(n)
        tracemalloc.start()
        t = read_trace(path)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert t.kernels == n and t.steps[0].kernels == n
    # What each added kernel (with its launch and its operator) costs: far under the
    # ~700 bytes of its three events in the file, and of a Python object per event.
    per_kernel = (peaks[1] - peaks[0]) / 12_000
    assert per_kernel < 100, per_kernel  # (the reader that kept tuples and names: 560)
