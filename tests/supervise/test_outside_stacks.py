"""The supervisor's sampling from outside: windows, the hand-over to the probe and back."""

from __future__ import annotations

import subprocess
import threading
from collections import deque
from pathlib import Path
from typing import Any

from tests.supervise.test_spy_trace import FETCHING, LOOP, frame, pop, push

from trainmedic.channel.wire import STACKS_INSIDE, STACKS_OUTSIDE
from trainmedic.record.events import EventKind
from trainmedic.record.types import LoaderActivity, RunEvent
from trainmedic.supervise.observe.outside_stacks import OutsideStacks, Window

SOCKET = [("Client.fetch", "/job/client.py", 40), ("socket.recv_into", "/py/socket.py", 700)]


def waiting(inner: list[tuple[str, str, int]], us: float = 200_000) -> list[Any]:
    loop = [(n, f.replace("/site/trainmedic", "/x/trainmedic"), ln) for n, f, ln in LOOP]
    after = [("<module>", "/job/train.py", 9)]
    return [frame("B", 1, 0, "thread (1): MainThread"), *push(1, 0, loop + inner),
            *pop(1, us, loop + inner), *push(1, us, after)]  # fmt: skip


class Harness:
    """Windows handed out from a queue; the process lives while windows remain."""

    def __init__(self, windows: list[Window]) -> None:
        self.windows = deque(windows)
        self.sent: list[bytes] = []
        self.activity: list[LoaderActivity] = []
        self.events: list[RunEvent] = []
        self.rates: list[int] = []
        self.outside = OutsideStacks(
            self.activity.append, self.events.append, lambda: 100.0,
            recorder=self.record, alive=lambda _pid: bool(self.windows),
        )  # fmt: skip

    def record(
        self, pid: int, seconds: int, rate: int, directory: Path,
        started: Any,
    ) -> Window:  # fmt: skip
        assert directory.is_dir()
        self.rates.append(rate)
        return self.windows.popleft()

    def send(self, data: bytes) -> bool:
        self.sent.append(data)
        return True

    def run(self) -> None:
        """Watch pid 42 until the watcher ends by itself, then stop."""
        self.outside.ring_taken(42, self.send)
        watcher = self.outside._threads[42]
        watcher.join(10.0)
        assert not watcher.is_alive()
        self.outside.stop()

    def states(self) -> list[str]:
        return [e.data["state"] for e in self.events if e.kind == EventKind.STACKS_OUTSIDE]


def ok(trace: list[Any]) -> Window:
    return Window(trace, 0, "", 0.25)


def check() -> Window:
    """The first window: it shows py-spy reads the process; its samples are the probe's."""
    return ok(waiting(FETCHING))


def test_a_read_window_hands_the_sampling_over_once_and_its_waits_are_recorded() -> None:
    h = Harness([check(), ok(waiting(FETCHING)), ok(waiting(FETCHING)), Window(None, 1, "", 0.0)])
    h.run()
    assert h.sent == [STACKS_OUTSIDE]
    assert [a.counts["transform"] for a in h.activity] == [10, 10]  # not the first window's
    assert all(a.pid == 42 and a.top_frames == {"job/train.py:12 __getitem__": 10}
               for a in h.activity)  # fmt: skip
    assert h.states() == ["outside", "usage"]
    assert h.rates == [50, 50, 50, 50]
    usage = h.events[-1].data
    assert usage["windows"] == 2 and usage["wait_samples"] == 20
    assert usage["cpu_s"] == 0.75


def test_a_process_py_spy_cannot_read_stays_with_its_probe() -> None:
    said = "Error: Permission Denied (os error 1)\nmore"
    h = Harness([Window(None, 1, said, 0.01), ok(waiting(FETCHING))])
    h.run()  # the watcher gave up after the first window
    assert h.sent == [] and h.activity == []
    assert h.states() == ["not_read"]
    assert "Permission Denied" in h.events[0].message


def test_waits_on_sockets_go_back_to_the_probe_which_names_the_server() -> None:
    h = Harness([check(), ok(waiting(FETCHING)), ok(waiting(SOCKET)), ok(waiting(FETCHING))])
    h.run()
    assert h.sent == [STACKS_OUTSIDE, STACKS_INSIDE]
    assert h.states()[:2] == ["outside", "inside"]
    assert len(h.windows) == 1  # no window after the hand-back


def test_windows_that_stop_reading_a_living_process_hand_it_back() -> None:
    h = Harness([check(), ok(waiting(FETCHING)), *[Window(None, 1, "Error: gone", 0.0)] * 3,
                 ok([])])  # fmt: skip
    h.run()
    assert h.sent == [STACKS_OUTSIDE, STACKS_INSIDE]
    assert "not_read" in h.states()


def test_stop_ends_a_running_window_with_sigint() -> None:
    started = threading.Event()
    procs: list[subprocess.Popen[bytes]] = []

    def record(pid: int, seconds: int, rate: int, directory: Path, on_start: Any) -> Window:
        proc = subprocess.Popen(["sleep", "30"])
        procs.append(proc)
        on_start(proc)
        started.set()
        proc.wait()
        return Window(None, proc.returncode, "", 0.0)

    outside = OutsideStacks(lambda _a: None, lambda _e: None, lambda: 1.0, recorder=record,
                            alive=lambda _pid: True)  # fmt: skip
    outside.ring_taken(7, lambda _b: True)
    assert started.wait(10.0)
    outside.stop(timeout_s=10.0)
    assert procs[0].returncode is not None and procs[0].returncode != 0
    outside.ring_taken(8, lambda _b: True)  # after the stop: nothing starts
    assert len(procs) == 1


def test_once_the_waits_are_known_the_rate_drops() -> None:
    long_wait = waiting(FETCHING, us=4_000_000)  # 200 samples of waiting at 50 a second
    h = Harness([check(), ok(long_wait), ok(long_wait), ok(long_wait), Window(None, 1, "", 0.0)])
    h.run()
    assert h.rates == [50, 50, 50, 20, 20]


def test_the_probe_samples_until_its_process_has_trained_a_while() -> None:
    ready = threading.Event()
    looked = threading.Event()

    def is_ready(_pid: int) -> bool:
        looked.set()
        return ready.is_set()

    h = Harness([check(), ok(waiting(FETCHING)), Window(None, 1, "", 0.0)])
    h.outside._ready = is_ready
    h.outside.ring_taken(42, h.send)
    assert looked.wait(10.0)
    # Only the first window ran (py-spy reads it); nothing is sent and the probe samples.
    assert len(h.windows) == 2 and h.sent == [] and h.activity == []
    ready.set()  # it has trained long enough (a launcher never does: it stays here)
    h.outside._threads[42].join(10.0)
    h.outside.stop()
    assert not h.windows and h.sent == [STACKS_OUTSIDE]
    assert [a.counts["transform"] for a in h.activity] == [10]
