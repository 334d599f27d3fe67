"""A wait on another thread that is already answered: the future done, the queue holding
an item, the event set, while the waiting thread has yet to get the interpreter lock back."""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from trainmedic.probe.answered import still_working, wait_answered
from trainmedic.probe.sampling import StackSampler
from trainmedic.record.types import LoaderActivity


@contextlib.contextmanager
def lock_held() -> Iterator[None]:
    """Keep the interpreter lock in this thread for the block (a woken thread cannot
    leave its wait meanwhile), as the sampler holds it while it samples."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def blocked(target: Callable[[], object], inner: str) -> tuple[threading.Thread, FrameType]:
    """A thread running ``target``, once its innermost frame is ``inner`` (its wait)."""
    t = threading.Thread(target=target, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(t.ident or 0)
        if frame is not None and frame.f_code.co_name == inner and frame.f_back is not None:
            time.sleep(0.01)  # inside the lock's acquire, not on the way there
            return t, sys._current_frames()[t.ident or 0]
        time.sleep(0.001)
    raise AssertionError(f"the thread never waited in {inner}")


def test_a_future_still_pending_is_not_answered_and_a_done_one_is() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    t, frame = blocked(future.result, "wait")
    assert wait_answered(frame) is False
    with lock_held():
        future.set_result(1)
        frame = sys._current_frames()[t.ident or 0]
        answered = wait_answered(frame)
        still_waiting = frame.f_code.co_name == "wait"
    t.join(5)
    assert still_waiting and answered is True


def test_a_queue_with_an_item_answers_its_get() -> None:
    q: queue.Queue[int] = queue.Queue()
    t, frame = blocked(q.get, "wait")
    assert wait_answered(frame) is False
    with lock_held():
        q.put(1)
        frame = sys._current_frames()[t.ident or 0]
        answered = wait_answered(frame)
    t.join(5)
    assert answered is True


def test_an_event_set_answers_its_wait() -> None:
    event = threading.Event()
    t, frame = blocked(event.wait, "wait")
    assert wait_answered(frame) is False
    with lock_held():
        event.set()
        frame = sys._current_frames()[t.ident or 0]
        answered = wait_answered(frame)
    t.join(5)
    assert answered is True


def test_other_frames_are_never_answered() -> None:
    assert wait_answered(None) is False
    assert wait_answered(sys._getframe()) is False


def test_the_sampler_counts_an_answered_wait_without_looking_at_the_helpers() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    helper_stop = threading.Event()
    helper = threading.Thread(target=helper_stop.wait, daemon=True)  # idle, if looked at
    helper.start()
    waiter, _ = blocked(future.result, "wait")
    records: list[list[LoaderActivity]] = [[], []]
    pending, answered = (
        StackSampler(lambda: [(waiter.ident or 0, "self")], out.append, pytest.fail, pid=1)
        for out in records
    )
    pending.sample_once()  # the helpers are looked at
    with lock_held():
        future.set_result(1)
        answered.sample_once()  # counted, the helpers not looked at
    waiter.join(5)
    helper_stop.set()
    pending.flush()
    answered.flush()
    (looked,), (skipped,) = records
    assert looked.handoff["waits"] == 1 and "delivered" not in looked.handoff
    assert any(k.startswith("thread:") for k in looked.handoff)
    assert skipped.counts["ipc_wait"] == 1
    assert skipped.handoff == {"waits": 1, "delivered": 1}


def test_an_answered_moment_keeps_the_helpers_still_working() -> None:
    # A pool: the thread that answered is idle now, the others compute the next futures.
    pool = Counter({"thread:python": 3, "thread:idle": 1, "in_flight": 0})
    assert still_working(pool) == Counter({"thread:python": 3, "in_flight": 0})
    # An event loop back in its selector, a producer on a full queue: nothing to keep.
    assert still_working(Counter({"thread:wait": 1})) == Counter()
    assert still_working(Counter({"process:idle": 2, "in_flight": 0})) == Counter()
    served = Counter({"process:socket": 1, "in_flight": 1, "server:cpu": 1})
    assert still_working(served) == served
