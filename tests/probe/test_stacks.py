"""Classifying loader stacks: by file, by the C call a frame is making, by role."""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainmedic.probe.frames import FrameInfo, callee_names
from trainmedic.probe.sampling import StackSampler
from trainmedic.probe.stacks import (
    STATES,
    ActivityAggregate,
    StackCache,
    classify,
    frame_key,
    read_frames,
)
from trainmedic.record.types import LoaderActivity


def make_frame(
    path: str, function: str = "f", line: int = 1, callees: tuple[str, ...] = ()
) -> FrameInfo:
    return FrameInfo(path, line, function, callees)


USER = "/home/me/train/dataset.py"
LIB = "/usr/lib/python3.11"


@pytest.mark.parametrize(
    ("stack", "role", "state"),
    [
        # Python code computing in the dataset: a transform.
        ([make_frame(USER, "__getitem__")], "main", "transform"),
        # A C call the dataset makes, told by the names it calls.
        ([make_frame(USER, "__getitem__", callees=("f", "read"))], "worker", "file_read"),
        ([make_frame(USER, "__getitem__", callees=("np", "load"))], "worker", "file_read"),
        ([make_frame(USER, "__getitem__", callees=("cv2", "imread"))], "worker", "file_read"),
        ([make_frame(USER, "fetch", callees=("sock", "recv_into"))], "worker", "socket_wait"),
        ([make_frame(USER, "fetch", callees=("requests", "get"))], "worker", "socket_wait"),
        ([make_frame(USER, "__getitem__", callees=("time", "sleep"))], "worker", "other"),
        ([make_frame(USER, "step", callees=("loss", "item"))], "self", "other"),
        # Libraries known by their files.
        ([make_frame(f"{LIB}/socket.py", "readinto"), make_frame(USER)], "worker", "socket_wait"),
        ([make_frame("/x/site-packages/urllib3/response.py", "read")], "worker", "socket_wait"),
        (
            [make_frame("/x/site-packages/PIL/Image.py", "open"), make_frame(USER)],
            "worker",
            "file_read",
        ),
        (
            [make_frame("/x/site-packages/PIL/Image.py", "resize"), make_frame(USER)],
            "worker",
            "transform",
        ),
        ([make_frame("/x/site-packages/numpy/lib/format.py", "read_array")], "main", "file_read"),
        (
            [make_frame("/x/site-packages/torch/utils/data/_utils/collate.py", "collate")],
            "main",
            "transform",
        ),
        # Waits delegate to the frame that waits: a queue.
        (
            [
                make_frame(f"{LIB}/selectors.py", "select"),
                make_frame(f"{LIB}/multiprocessing/connection.py", "poll"),
                make_frame(f"{LIB}/multiprocessing/queues.py", "get"),
                make_frame("/x/site-packages/torch/utils/data/_utils/worker.py", "_worker_loop"),
            ],
            "worker",
            "idle",
        ),
        (
            [
                make_frame(f"{LIB}/threading.py", "wait"),
                make_frame(f"{LIB}/queue.py", "get"),
                make_frame("/x/site-packages/torch/utils/data/dataloader.py", "_try_get_data"),
            ],
            "main",
            "ipc_wait",
        ),
        (
            [make_frame(f"{LIB}/threading.py", "wait"), make_frame(f"{LIB}/queue.py", "get")],
            "pin",
            "idle",
        ),
        (
            [make_frame("/x/site-packages/torch/utils/data/_utils/pin_memory.py", "pin_memory")],
            "pin",
            "other",
        ),
        ([], "main", "other"),
    ],
)
def test_classify(stack: list[FrameInfo], role: str, state: str) -> None:
    assert classify(stack, role) == state


def test_frame_key_names_the_leaf_and_the_scripts_own_frame() -> None:
    stack = [
        make_frame("/x/site-packages/PIL/Image.py", "open", 3240),
        make_frame("/x/site-packages/torchvision/datasets/folder.py", "pil_loader", 260),
        make_frame(USER, "__getitem__", 42),
    ]
    assert frame_key(stack) == "PIL/Image.py:3240 open < train/dataset.py:42 __getitem__"
    assert frame_key([make_frame(USER, "__getitem__", 7)]) == "train/dataset.py:7 __getitem__"


def _np_like() -> None:
    class Numpy:
        @staticmethod
        def load(path: str) -> None:
            return None

    np = Numpy()
    np.load("x")


def _read_whole_file() -> None:
    open(os.devnull).read()  # noqa: SIM115


def _calls_in(fn: Callable[..., object]) -> list[tuple[str, ...]]:
    """callee_names at every call instruction of ``fn``."""
    import dis

    return [
        callee_names(fn.__code__, ins.offset)
        for ins in dis.get_instructions(fn)
        if ins.opname.startswith("CALL")
    ]


@pytest.mark.parametrize(
    ("fn", "expected"),
    [(_np_like, ("np", "load")), (_read_whole_file, ("open", "read"))],
)
def test_callee_names_read_the_call_being_made(
    fn: Callable[..., None], expected: tuple[str, ...]
) -> None:
    assert expected in _calls_in(fn)


@pytest.fixture
def blocked_threads() -> Iterator[dict[str, threading.Thread]]:
    r, w = os.pipe()
    a, b = socket.socketpair()
    q: queue.Queue[int] = queue.Queue()
    started = threading.Barrier(4)

    def reader() -> None:
        started.wait()
        os.read(r, 1)

    def receiver() -> None:
        started.wait()
        a.recv(1)

    def waiter() -> None:
        started.wait()
        q.get()

    threads = {
        "reader": threading.Thread(target=reader, daemon=True),
        "receiver": threading.Thread(target=receiver, daemon=True),
        "waiter": threading.Thread(target=waiter, daemon=True),
    }
    for t in threads.values():
        t.start()
    started.wait()
    yield threads
    os.write(w, b"x")
    b.send(b"x")
    q.put(1)
    for t in threads.values():
        t.join(5)
    for fd in (r, w):
        os.close(fd)
    a.close()
    b.close()


def _settled(thread: threading.Thread, leaf: str, via: str | None = None) -> list[FrameInfo]:
    """The thread's stack once its innermost frame is ``leaf`` (it is blocked there),
    reached through a frame named ``via`` when given (the start barrier's own
    ``wait`` must not count as the queue's)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stack = read_frames(sys._current_frames()[thread.ident or 0])
        if (
            stack
            and stack[0].function == leaf
            and (via is None or any(f.function == via for f in stack))
        ):
            return stack
        time.sleep(0.001)
    raise AssertionError(f"the thread never blocked in {leaf}")


def test_live_threads_blocked_in_io_are_classified(
    blocked_threads: dict[str, threading.Thread],
) -> None:
    reader = _settled(blocked_threads["reader"], "reader")
    receiver = _settled(blocked_threads["receiver"], "receiver")
    waiter = _settled(blocked_threads["waiter"], "wait", via="get")
    assert reader[0].callees == ("os", "read")
    assert classify(reader, "worker") == "file_read"
    assert classify(receiver, "worker") == "socket_wait"
    assert classify(waiter, "worker") == "idle"
    assert classify(waiter, "main") == "ipc_wait"


def test_aggregate_counts_states_and_frames_then_starts_over() -> None:
    agg = ActivityAggregate()
    for _ in range(3):
        agg.add([make_frame(USER, "__getitem__", 10)], "worker")
    agg.add([make_frame(f"{LIB}/queue.py", "get")], "worker")
    record = agg.take(123.0, pid=42)
    assert record == LoaderActivity(
        t=123.0,
        pid=42,
        counts={s: {"transform": 3, "idle": 1}.get(s, 0) for s in STATES},
        top_frames={"train/dataset.py:10 __getitem__": 3},
    )
    assert agg.take(124.0, pid=42) is None


def test_sampler_samples_only_what_targets_name_and_flushes_records(
    blocked_threads: dict[str, threading.Thread],
) -> None:
    out: list[LoaderActivity] = []
    errors: list[BaseException] = []
    wanted: list[tuple[int, str]] = []
    sampler = StackSampler(lambda: wanted, out.append, errors.append, pid=7, wall=lambda: 1.0)
    assert sampler.sample_once() == 0
    _settled(blocked_threads["reader"], "reader")
    wanted.append((blocked_threads["reader"].ident or 0, "worker"))
    assert sampler.sample_once() == 1
    assert sampler.sample_once() == 1
    sampler.flush()
    assert out[0].counts["file_read"] == 2
    assert out[0].pid == 7
    assert errors == []


def test_a_stack_seen_before_is_classified_from_the_cache(
    blocked_threads: dict[str, threading.Thread], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainmedic.probe import stacks

    reader = blocked_threads["reader"]
    stack = _settled(reader, "reader")
    reads: list[int] = []
    real = stacks.read_frames

    def counting(frame: Any, limit: int = stacks.MAX_FRAMES) -> list[FrameInfo]:
        reads.append(1)
        return real(frame, limit)

    monkeypatch.setattr(stacks, "read_frames", counting)
    cache = StackCache()
    frame = sys._current_frames()[reader.ident or 0]
    first = cache.classify(frame, "worker")
    again = cache.classify(sys._current_frames()[reader.ident or 0], "worker")
    assert first == again == ("file_read", frame_key(stack))
    assert len(reads) == 1  # the second sample did not read the frames again
    assert cache.classify(frame, "main")[0] == "file_read"  # another role: classified anew
    assert len(reads) == 2
