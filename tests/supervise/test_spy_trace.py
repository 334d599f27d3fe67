"""Reading py-spy's chrometrace of a training process: its waits for data, classified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainmedic.supervise.observe.spy_trace import (
    WAIT_FUNCTION,
    WRAPPER_FILE,
    callees_on_line,
    count_waits,
    in_data_wait,
    parse_chrometrace,
)

HOOKS = "/site/trainmedic/probe/torch_hooks.py"
FETCH = "/site/torch/utils/data/_utils/fetch.py"
PIN = "/site/torch/utils/data/_utils/pin_memory.py"
SCRIPT = "/job/train.py"


def frame(
    ph: str, tid: int, ts: float, name: str, filename: str = "", line: int = 0
) -> dict[str, Any]:
    return {
        "ph": ph, "tid": tid, "ts": ts, "name": name, "pid": 1, "cat": "py-spy",
        "args": {"filename": filename, "line": line},
    }  # fmt: skip


def push(tid: int, ts: float, frames: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    return [frame("B", tid, ts, n, f, line) for n, f, line in frames]


def pop(tid: int, ts: float, frames: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    return [frame("E", tid, ts, n, f, line) for n, f, line in reversed(frames)]


LOOP = [
    ("<module>", SCRIPT, 30),
    ("_install_loader.<locals>.__next__", HOOKS, 284),
    ("wait_for_batch", HOOKS, 256),
]
FETCHING = [("_MapDatasetFetcher.fetch", FETCH, 52), ("Digits.__getitem__", SCRIPT, 12)]
COMPUTE = [("<module>", SCRIPT, 33), ("Net.forward", SCRIPT, 20)]
PIN_LOOP = [
    ("Thread.run", "/py/threading.py", 982),
    ("_pin_memory_loop", PIN, 49),
    ("Queue.get", "/py/queue.py", 180),
]


def trace() -> list[Any]:
    """At 100 samples a second: 50 ms in the loader's ``__getitem__`` (a wait), then
    30 ms of compute, while the pin-memory thread sits in its loop."""
    main, pin = 7, 9
    return [
        frame("B", main, 0, "thread (1001): MainThread"),
        *push(main, 0, LOOP + FETCHING),
        frame("B", pin, 0, "thread (1002): Thread-2"),
        *push(pin, 0, PIN_LOOP),
        *pop(main, 50_000, LOOP + FETCHING),
        *push(main, 50_000, COMPUTE),
        *pop(main, 80_000, COMPUTE),
        *push(main, 80_000, [("<module>", SCRIPT, 34)]),
        "not an event", {"ph": "B", "tid": "x"}, {"ph": "X", "tid": 7, "ts": 1, "name": "n"},
    ]  # fmt: skip


def test_the_trace_becomes_each_threads_timeline_of_stacks() -> None:
    threads = parse_chrometrace(trace())
    assert {t.native_id: t.name for t in threads.values()} == {1001: "MainThread", 1002: "Thread-2"}
    main = threads[7]
    assert [ts for ts, _ in main.changes] == [0, 50_000, 80_000]
    first = main.changes[0][1]
    # Innermost first, py-spy's qualified names back to the code's own.
    assert [f.function for f in first] == [
        "__getitem__", "fetch", "wait_for_batch", "__next__", "<module>",
    ]  # fmt: skip
    assert first[2].path.endswith(WRAPPER_FILE)
    assert parse_chrometrace({"traceEvents": []}) == {} and parse_chrometrace("x") == {}


def test_only_the_moments_in_a_data_wait_are_counted_with_the_pin_thread_beside_them() -> None:
    counts = count_waits(parse_chrometrace(trace()), rate=100)
    # 5 samples in the wait (50 ms at 100/s), 3 of compute, 1 after the last change.
    assert counts.samples == 9 and counts.wait_samples == 5
    assert counts.states == {"transform": 5}
    agg = counts.aggregate
    assert agg.counts == {"transform": 5, "idle": 5}  # the pin thread waited for work
    assert agg.frames == {"job/train.py:12 __getitem__": 5}


def test_a_thread_that_passes_through_the_wrapper_elsewhere_does_not_wait() -> None:
    other = [("<module>", SCRIPT, 30), ("__next__", HOOKS, 267), *FETCHING]
    events = [frame("B", 3, 0, "thread (5): Eval"), *push(3, 0, other), *pop(3, 40_000, other)]
    counts = count_waits(parse_chrometrace(events), rate=100)
    assert counts.wait_samples == 0 and not counts.aggregate.counts
    stack = parse_chrometrace(events)[3].changes[0][1]
    assert not in_data_wait(stack)
    # The waiting function as the innermost frame has not called the loader yet.
    waits = parse_chrometrace([frame("B", 1, 0, "thread (1): T"), *push(1, 0, LOOP)])
    assert not in_data_wait(waits[1].changes[-1][1])


def test_the_training_thread_named_by_its_id_is_the_only_one_counted() -> None:
    events = [
        frame("B", 7, 0, "thread (1001): MainThread"), *push(7, 0, LOOP + FETCHING),
        frame("B", 8, 0, "thread (1003): Other"), *push(8, 0, LOOP + FETCHING),
        *pop(7, 20_000, LOOP + FETCHING), *pop(8, 20_000, LOOP + FETCHING),
    ]  # fmt: skip
    threads = parse_chrometrace(events)
    assert count_waits(threads, rate=100).wait_samples == 2
    named = count_waits(threads, rate=100, training_native_id=1001)
    assert named.wait_samples == 2 and named.aggregate.counts == {"transform": 2}


def test_a_leaf_blocked_in_a_c_call_is_named_from_its_source_line(tmp_path: Path) -> None:
    script = tmp_path / "load.py"
    script.write_text(
        "import numpy as np\n"
        "def get(path):\n"
        "    data = np.load(path)\n"
        "    return data\n"
    )
    assert callees_on_line(str(script), 3) == ("np", "load")
    assert callees_on_line(str(script), 4) == ()
    assert callees_on_line(str(tmp_path / "missing.py"), 3) == ()
    events = [
        frame("B", 1, 0, "thread (1): MainThread"),
        *push(1, 0, [*LOOP, ("get", str(script), 3)]),
    ]
    counts = count_waits(parse_chrometrace(events), rate=100)
    assert counts.states == {"file_read": 1}


def test_the_probes_wrapper_waits_for_a_batch_in_the_function_looked_for() -> None:
    import inspect

    from trainmedic.probe import torch_hooks

    assert torch_hooks.wait_for_batch.__name__ == WAIT_FUNCTION
    assert f"batch = {WAIT_FUNCTION}(original_next, self)" in inspect.getsource(torch_hooks)
    assert torch_hooks.__file__.replace("\\", "/").endswith(WRAPPER_FILE)


def test_a_windows_counts_go_out_a_record_per_slice_stamped_with_its_end() -> None:
    from trainmedic.supervise.observe.spy_trace import activities

    main = 7
    events = [
        frame("B", main, 0, "thread (1001): MainThread"),
        *push(main, 500_000, LOOP + FETCHING), *pop(main, 600_000, LOOP + FETCHING),
        *push(main, 4_500_000, LOOP + FETCHING), *pop(main, 4_800_000, LOOP + FETCHING),
        *push(main, 4_800_000, COMPUTE),
    ]  # fmt: skip
    counts = count_waits(parse_chrometrace(events), rate=100, slice_s=2.0)
    assert sorted(counts.slices) == [0, 2]  # nothing waited between 2 s and 4 s
    records = activities(counts, started=1000.0, ended=1005.0, pid=42, slice_s=2.0)
    assert [(r.t, r.counts["transform"]) for r in records] == [(1002.0, 10), (1005.0, 30)]
    assert all(r.pid == 42 for r in records)
    assert counts.aggregate.counts["transform"] == 40  # the window's whole
