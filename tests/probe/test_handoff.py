"""Following the training thread's wait to the threads and processes doing the work
(trainmedic.probe.handoff): what a helper's stack and kernel state say, and the sampler
looking at them only while the training thread waits on them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import sys
import sysconfig
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from trainmedic.host.peers import Peer
from trainmedic.host.threadstate import KernelState
from trainmedic.probe.frames import FrameInfo
from trainmedic.probe.handoff import (
    HelperSampler,
    classify_helper,
    frame_socket,
    loop_descriptors,
    process_state,
    refine,
)
from trainmedic.probe.host_states import waits_on_others
from trainmedic.probe.sampling import StackSampler
from trainmedic.probe.stacks import StackCache, read_frames
from trainmedic.record.types import LoaderActivity

LIB = sysconfig.get_paths()["stdlib"]
LINUX = sys.platform.startswith("linux") and Path("/proc/self/task").is_dir()
USER = "/home/me/project/train.py"


def f(path: str, function: str = "main", callees: tuple[str, ...] = ()) -> FrameInfo:
    return FrameInfo(path, 1, function, callees)


@pytest.mark.parametrize(
    ("stack", "waits"),
    [
        # future.result() of a thread or process pool
        ([f(f"{LIB}/threading.py", "wait"), f(f"{LIB}/concurrent/futures/_base.py", "result"),
          f(USER)], True),
        # a prefetch thread's queue.Queue
        ([f(f"{LIB}/threading.py", "wait"), f(f"{LIB}/queue.py", "get"), f(USER)], True),
        # producer processes' multiprocessing.Queue
        ([f(f"{LIB}/multiprocessing/connection.py", "_recv"),
          f(f"{LIB}/multiprocessing/queues.py", "get"), f(USER)], True),
        # run_coroutine_threadsafe(...).result(): a concurrent future too
        ([f(f"{LIB}/threading.py", "wait"), f(f"{LIB}/concurrent/futures/_base.py", "result"),
          f(USER, "next_batch")], True),
        # an event another thread sets, waited on by the loop itself
        ([f(f"{LIB}/threading.py", "wait"), f(f"{LIB}/threading.py", "wait"), f(USER)], True),
        # a C queue (queue.SimpleQueue), a lock
        ([f(USER, callees=("ready", "get"))], True),
        ([f(USER, callees=("lock", "acquire"))], True),
        # not waiting on others: joining threads at exit, a dict lookup, a socket, compute
        ([f(f"{LIB}/threading.py", "_wait_for_tstate_lock"), f(f"{LIB}/threading.py", "join"),
          f(f"{LIB}/threading.py", "_shutdown")], False),
        ([f(USER, callees=("cache", "get"))], False),
        # a stop flag checked every step, an event set, a queue told: threading's
        # calls that return at once
        ([f(f"{LIB}/threading.py", "is_set"), f(USER)], False),
        ([f(f"{LIB}/threading.py", "notify_all"), f(f"{LIB}/threading.py", "set"), f(USER)],
         False),
        ([f(f"{LIB}/threading.py", "notify"), f(f"{LIB}/queue.py", "put"), f(USER)], False),
        # ... but entering a condition or a semaphore's acquire can block
        ([f(f"{LIB}/threading.py", "acquire"), f(USER)], True),
        ([f(f"{LIB}/threading.py", "__enter__"), f(f"{LIB}/threading.py", "wait"), f(USER)],
         True),
        # a condition's wait, caught in its own bookkeeping before it blocks
        ([f(f"{LIB}/threading.py", "_release_save"), f(f"{LIB}/threading.py", "wait"),
          f(f"{LIB}/threading.py", "wait"), f(USER)], True),
        ([f(f"{LIB}/socket.py", "readinto"), f(USER)], False),
        ([f(USER, "make_batch")], False),
        ([], False),
    ],
)  # fmt: skip
def test_the_training_thread_waiting_on_others_is_recognised(
    stack: list[FrameInfo], waits: bool
) -> None:
    assert waits_on_others(stack) is waits


@pytest.mark.parametrize(
    ("stack", "state"),
    [
        # a pool thread waiting for a task
        ([f(f"{LIB}/threading.py", "wait"), f(f"{LIB}/queue.py", "get"),
          f(f"{LIB}/concurrent/futures/thread.py", "_worker")], "idle"),
        # fetching: a socket read, a file read
        ([f(f"{LIB}/socket.py", "readinto"), f(USER, "fetch")], "socket"),
        ([f(USER, "fetch", ("os", "read"))], "file"),
        # an asyncio loop waiting for its descriptors
        ([f(f"{LIB}/selectors.py", "select"), f(f"{LIB}/asyncio/base_events.py", "_run_once"),
          f(f"{LIB}/asyncio/base_events.py", "run_forever")], "poll"),
        # computing in Python (bytecode), or inside a call into C
        ([f(USER, "featurize"), f(f"{LIB}/concurrent/futures/thread.py", "run")], "python"),
        ([f(USER, "featurize", ("np", "fft", "fft"))], "native"),
        # a pool thread running a task that is itself a C function (pool.submit(sock.recv))
        ([f(f"{LIB}/concurrent/futures/thread.py", "run", ("self", "fn")),
          f(f"{LIB}/concurrent/futures/thread.py", "_worker")], "native"),
        # blocked: a sleep, an event
        ([f(USER, "throttle", ("time", "sleep"))], "wait"),
        ([f(f"{LIB}/threading.py", "wait"), f(USER, "produce")], "wait"),
        # checking its stop flag between two pieces of work: running Python
        ([f(f"{LIB}/threading.py", "is_set"), f(USER, "produce")], "python"),
    ],
)  # fmt: skip
def test_a_helper_threads_stack(stack: list[FrameInfo], state: str) -> None:
    assert classify_helper(stack) == state


@pytest.mark.parametrize(
    ("stack_state", "kernel", "sockets", "state"),
    [
        ("python", None, False, "python"),  # bytecode: no kernel reading needed
        ("socket", None, False, "socket"),
        ("poll", None, True, "socket"),  # an event loop holding connections
        ("poll", None, False, "poll"),
        ("poll", KernelState("S", "epoll_wait"), True, "socket"),
        # The selector returned: waiting for a CPU or the interpreter lock to run callbacks.
        ("poll", KernelState("R", "running"), True, "python"),
        ("poll", KernelState("S", "futex"), False, "python"),
        ("native", KernelState("R", "running"), False, "cpu"),
        ("native", KernelState("S", "futex"), False, "python"),  # back for the lock
        ("native", KernelState("S", "recvfrom", "socket"), False, "socket"),  # C I/O
        ("native", KernelState("S", "read", "file"), False, "file"),
        ("native", KernelState("D", "read", "file"), False, "file"),
        ("native", KernelState("S", "read", "pipe"), False, "wait"),
        ("other", KernelState("S", "poll"), True, "socket"),
        ("other", KernelState("S", "nanosleep"), False, "wait"),
    ],
)
def test_the_kernel_state_refines_what_a_stack_cannot_tell(
    stack_state: str, kernel: KernelState | None, sockets: bool, state: str
) -> None:
    assert refine(stack_state, kernel, sockets) == state


@pytest.mark.parametrize(
    ("kernel", "sockets", "state"),
    [
        (KernelState("R", "running"), False, "cpu"),
        (KernelState("S", "recvfrom", "socket"), False, "socket"),
        (KernelState("S", "poll"), True, "socket"),  # Python's socket timeout polls
        (KernelState("S", "poll"), False, "poll"),
        (KernelState("D", "read", "file"), False, "file"),
        (KernelState("S", "futex"), False, "idle"),  # on a full queue
        (KernelState("S", "nanosleep"), False, "wait"),
        (None, False, None),
    ],
)
def test_a_child_process_from_its_kernel_state(
    kernel: KernelState | None, sockets: bool, state: str | None
) -> None:
    assert process_state(kernel, sockets) == state


# --- live threads --------------------------------------------------------------------------


@pytest.fixture
def socket_pool() -> Iterator[tuple[concurrent.futures.Future[bytes], list[threading.Thread]]]:
    """Two pool threads blocked reading sockets nobody writes to yet, and a future on one."""
    pairs = [socket.socketpair() for _ in range(2)]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fetch")
    futures = [pool.submit(a.recv, 1) for a, _ in pairs]
    deadline = time.monotonic() + 5
    while len(pool._threads) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)  # both inside recv
    yield futures[0], list(pool._threads)
    for _, b in pairs:
        b.send(b"x")
    pool.shutdown(wait=True)
    for a, b in pairs:
        a.close()
        b.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_the_sampler_follows_a_wait_on_futures_to_threads_in_socket_reads(
    socket_pool: tuple[concurrent.futures.Future[bytes], list[threading.Thread]],
) -> None:
    future, helpers = socket_pool
    waiter = threading.Thread(target=future.result, daemon=True)
    waiter.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stack = read_frames(sys._current_frames().get(waiter.ident or 0))
        if stack and waits_on_others(stack):
            break
        time.sleep(0.001)
    out: list[LoaderActivity] = []
    sampler = StackSampler(lambda: [(waiter.ident or 0, "self")], out.append, pytest.fail, pid=1)
    for _ in range(3):
        sampler.sample_once()
    sampler.flush()
    (record,) = out
    assert record.counts["ipc_wait"] == 3
    assert record.handoff["waits"] == 3
    assert record.handoff["thread:socket"] == 3 * len(helpers)  # both, each time
    assert record.handoff["in_flight"] == 3 * len(helpers)
    assert all("test_handoff" not in key for key in record.helper_frames)  # not the sampler


def test_helpers_are_not_looked_at_while_the_training_thread_is_not_waiting_on_them(
    socket_pool: tuple[concurrent.futures.Future[bytes], list[threading.Thread]],
) -> None:
    busy = threading.Event()
    running = threading.Event()

    def compute() -> None:
        running.set()
        while not busy.is_set():
            sum(range(1000))

    worker = threading.Thread(target=compute, daemon=True)
    worker.start()
    # Sampled while still starting, the thread waits in threading's own start-up.
    assert running.wait(10)
    out: list[LoaderActivity] = []
    sampler = StackSampler(lambda: [(worker.ident or 0, "self")], out.append, pytest.fail, pid=1)
    try:
        for _ in range(5):
            sampler.sample_once()
    finally:
        busy.set()
    sampler.flush()
    assert out and not out[0].handoff and sampler._helpers is None


def test_a_pool_computing_python_is_python_not_io() -> None:
    stop = threading.Event()

    def crunch() -> None:
        x = 0
        while not stop.is_set():
            for i in range(500):
                x = (x * 31 + i) % 1000003

    threads = [threading.Thread(target=crunch, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.02)
    sampler = HelperSampler(StackCache().classify, list_children=lambda: [])
    seen: Counter[str] = Counter()
    try:
        for _ in range(5):
            seen += sampler.sample(sys._current_frames(), frozenset({threading.get_ident()}))[0]
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    # (a sample may catch one at a call, read from its kernel state then)
    assert seen["thread:python"] >= 10
    assert not seen["thread:socket"] and not seen["thread:file"]


def test_children_are_read_from_their_kernel_state_only() -> None:
    reads: list[tuple[int | str, int]] = []

    def kernel(pid: int | str, tid: int) -> KernelState:
        reads.append((pid, tid))
        return KernelState("S", "poll")

    class Peers:
        """A producer polling its one store connection: the store is its sole peer."""

        def __init__(self, pid: int | str) -> None:
            self.pid = pid

        def peer(self, inode: str) -> Peer | None:
            raise AssertionError("a poll names no socket")

        def sole(self) -> Peer | None:
            return Peer(9, "python store.py") if self.pid == 4242 else None

    sampler = HelperSampler(
        StackCache().classify, read_kernel=kernel, list_children=lambda: [4242, 4243],
        connections=lambda pid: 1 if pid == 4242 else 0, threads=lambda: [], peers=Peers,
        activity=lambda pid: ("cpu", 1),
    )  # fmt: skip
    seen, _ = sampler.sample({}, frozenset())
    assert reads == [(4242, 4242), (4243, 4243)]  # each child's main thread
    assert seen == {"process:socket": 1, "process:poll": 1, "in_flight": 1, "server:cpu": 1,
                    "server_running": 1, "peer:9 python store.py": 1}  # fmt: skip


# --- a server at the far end, an event loop's own descriptors --------------------------------


def blocked_reader(sock: socket.socket) -> threading.Thread:
    """A thread reading ``sock`` through ``makefile``, as HTTP clients and stores do."""
    reader = sock.makefile("rb")
    t = threading.Thread(target=reader.read, args=(4,), daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stack = read_frames(sys._current_frames().get(t.ident or 0))
        if stack and stack[0].path.endswith("socket.py"):
            break
        time.sleep(0.001)
    return t


def test_the_socket_a_thread_reads_is_found_in_its_frames() -> None:
    a, b = socket.socketpair()
    try:
        t = blocked_reader(a)
        assert frame_socket(sys._current_frames()[t.ident or 0]) == a.fileno()
        assert frame_socket((lambda: sys._getframe())(), depth=1) is None  # no socket there
    finally:
        b.send(b"abcd")
        t.join(5)
        a.close()
        b.close()


def test_helpers_on_a_socket_to_a_local_server_look_at_that_server() -> None:
    a, b = socket.socketpair()
    asked: list[tuple[int | str, str]] = []

    class Peers:
        def __init__(self, pid: int | str) -> None:
            self.pid = pid

        def peer(self, inode: str) -> Peer | None:
            asked.append((self.pid, inode))
            return Peer(777, "python store.py")

        def sole(self) -> Peer | None:
            raise AssertionError("the thread's own socket is known")

    try:
        t = blocked_reader(a)
        sampler = HelperSampler(
            StackCache().classify, list_children=lambda: [], peers=Peers,
            activity=lambda pid: ("cpu", 2) if pid == 777 else None,
        )  # fmt: skip
        seen: Counter[str] = Counter()
        for _ in range(3):
            seen += sampler.sample(only(t.ident or 0), set())[0]
    finally:
        b.send(b"abcd")
        t.join(5)
        a.close()
        b.close()
    target = Path(f"/proc/self/fd/{a.fileno()}") if LINUX else None
    assert seen["thread:socket"] == 3
    assert seen["server:cpu"] == 3 and seen["server_running"] == 6
    assert seen["peer:777 python store.py"] == 3
    assert asked and all(pid == "self" for pid, _ in asked)
    if target is not None:
        assert len({inode for _, inode in asked}) == 1  # the socket the thread reads


@contextlib.contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.close()


def loop_frame(loop: asyncio.AbstractEventLoop) -> tuple[int, FrameType]:
    """The loop's thread and its innermost frame, once it waits in its selector."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for ident, frame in sys._current_frames().items():
            selector = getattr(loop, "_selector", None)
            if frame.f_code.co_filename.endswith("selectors.py") and (
                frame.f_locals.get("self") is selector
            ):
                return ident, frame
        time.sleep(0.001)
    raise AssertionError("the loop never waited in its selector")


def only(ident: int) -> dict[int, FrameType]:
    """The frames of one thread: the others of the test process are not looked at."""
    return {ident: sys._current_frames()[ident]}


def test_an_event_loop_on_timers_only_waits_and_is_not_the_network() -> None:
    # The process holds a TCP connection (as DDP's store does), but the loop only sleeps.
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    with event_loop() as loop:
        async def timer() -> None:
            loop.call_later(30, lambda: None)  # a timer, no I/O

        asyncio.run_coroutine_threadsafe(timer(), loop).result(5)
        time.sleep(0.05)  # back in its selector, not just woken from it
        ident, frame = loop_frame(loop)
        assert loop_descriptors(frame) == []  # its own wake-up socket left out
        del frame
        sampler = HelperSampler(StackCache().classify, list_children=lambda: [])
        seen = sampler.sample(only(ident), set())[0]
    client.close()
    server.close()
    assert seen["thread:wait"] == 1 and not seen["thread:socket"] and not seen["in_flight"], seen


@pytest.mark.parametrize(
    ("kernel", "state"),
    [(KernelState("S", "epoll_wait"), "wait"), (KernelState("R", "running"), "python"),
     (KernelState("S", "futex"), "python")],
)  # fmt: skip
def test_an_event_loop_whose_selector_returned_has_python_to_run(
    kernel: KernelState, state: str
) -> None:
    # Its stack still shows the selector until it has a CPU and the interpreter lock back;
    # its kernel state says whether the selector returned.
    with event_loop() as loop:
        ident, frame = loop_frame(loop)
        del frame
        sampler = HelperSampler(
            StackCache().classify, read_kernel=lambda pid, tid: kernel, list_children=lambda: []
        )
        seen = sampler.sample(only(ident), set())[0]
    assert seen == Counter({f"thread:{state}": 1}), seen


def test_an_event_loop_reading_sockets_holds_one_request_on_each() -> None:
    pairs = [socket.socketpair() for _ in range(3)]
    expected = sorted(a.fileno() for a, _ in pairs)
    with event_loop() as loop:

        async def read_all() -> None:
            streams = [await asyncio.open_connection(sock=a) for a, _ in pairs]
            await asyncio.gather(*(r.read(1) for r, _ in streams))

        future = asyncio.run_coroutine_threadsafe(read_all(), loop)
        deadline = time.monotonic() + 5
        fds: list[int] | None = []
        ident = 0
        while time.monotonic() < deadline and len(fds or []) < 3:
            ident, frame = loop_frame(loop)
            fds = loop_descriptors(frame)
            del frame
        time.sleep(0.05)  # back in its selector, not just woken from it
        sampler = HelperSampler(StackCache().classify, list_children=lambda: [])
        seen = sampler.sample(only(ident), set())[0]
        for _, b in pairs:
            b.send(b"x")
        future.result(5)
    for a, b in pairs:
        a.close()
        b.close()
    assert sorted(fds or []) == expected
    assert seen["thread:socket"] == 1 and seen["in_flight"] == 3


BUSY_SERVER = """
import os, socket, sys, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
print("accepted", flush=True)
x = 0
while True:
    x = (x * 31 + 7) % 1000003
"""


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_loop_reading_a_socket_itself_looks_at_the_server_answering() -> None:
    import subprocess

    server = subprocess.Popen(
        [sys.executable, "-c", BUSY_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert server.stdout is not None
    sock = socket.create_connection(("127.0.0.1", int(server.stdout.readline())))
    assert server.stdout.readline().strip() == "accepted"
    reader = blocked_reader(sock)
    try:
        out: list[LoaderActivity] = []
        sampler = StackSampler(
            lambda: [(reader.ident or 0, "self")], out.append, pytest.fail, pid=1
        )
        for _ in range(20):
            sampler.sample_once()
        sampler.flush()
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)
        sock.close()
        reader.join(5)
    (record,) = out
    assert record.counts["socket_wait"] == 20
    assert "waits" not in record.handoff  # no hand-off: the loop itself waits
    looks = sum(n for k, n in record.handoff.items() if k.startswith("server:"))
    assert looks == 20 and record.handoff["server:cpu"] >= 15  # (a look may catch it off)
    (peer,) = [k for k in record.handoff if k.startswith("peer:")]
    assert peer.startswith(f"peer:{server.pid} python -c") and record.handoff[peer] == 20
