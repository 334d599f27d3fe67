"""The silence classifier on hand-built windows: each class, the job's verdict, and
cases built to fool it."""

from __future__ import annotations

import pytest

from trainmedic.resilience.places import Place
from trainmedic.resilience.silence import classify_job, classify_process, kernel_kind
from trainmedic.resilience.silence_evidence import KernelView, ProcessWindow, Silence, StackView

MIB = 2**20


def place(*calls: str, op: str = "CALL", module: str = "__main__") -> Place:
    return Place(("train.py:42 main",), (module,), calls, op)


def kernel(
    cpu: float = 0.0,
    state: str = "S",
    syscall: str | None = None,
    target: str | None = None,
    **counters: object,
) -> KernelView:
    return KernelView(
        span_s=1.0, cpu_s=cpu, state=state, syscall=syscall, target=target, **counters
    )  # type: ignore[arg-type]


def window(
    stack: Place | StackView | None,
    k: KernelView | None,
    pid: int = 10,
    role: str = "process",
    **extra: object,
) -> ProcessWindow:
    view = StackView(place=stack, samples=4) if isinstance(stack, Place) else stack
    return ProcessWindow(pid, role, None, True, k, view, **extra)  # type: ignore[arg-type]


def silence_of(stack: Place | StackView | None, k: KernelView | None, **extra: object) -> Silence:
    return classify_process(window(stack, k, **extra)).silence


# --- one process: the catalogue ---------------------------------------------------------


@pytest.mark.parametrize(
    ("stack", "k", "expected"),
    [
        # work
        (StackView(place("model"), work=12), kernel(), Silence.WORK),  # an unmarked evaluation
        (place("torch", "linalg", "eigh"), kernel(cpu=1.9), Silence.WORK),  # one long native call
        (place(op="BINARY_OP"), kernel(cpu=2.0), Silence.WORK),  # a @ b
        (
            Place(("serialization.py:1 _save",), ("torch.serialization",), ("f", "write")),
            kernel(cpu=0.9, dirtied_bytes=300 * MIB),
            Silence.WORK,
        ),  # a large write still in flight
        (
            place("os", "fsync"),
            kernel(state="D", syscall="fsync", flushed_bytes=200 * MIB),
            Silence.WORK,
        ),  # storage flushing a checkpoint
        (place("sock", "recv"), kernel(syscall="recvfrom", wakeups=3), Silence.WORK),
        (place("f", "read"), kernel(io_bytes=4096), Silence.WORK),
        (place("time", "sleep"), kernel(growth_bytes=64 * MIB), Silence.WORK),  # another thread
        # blocked
        (place("time", "sleep"), kernel(syscall="clock_nanosleep"), Silence.BLOCKED),
        (place("time", "sleep"), kernel(state="R", cpu=0.01), Silence.BLOCKED),  # waking up
        (place("lock", "acquire"), kernel(syscall="futex"), Silence.BLOCKED),
        (place("time", "sleep"), kernel(io_bytes=300), Silence.BLOCKED),  # a log line
        (place("torch", "linalg", "eigh"), kernel(cpu=0.0), Silence.BLOCKED),  # deadlocked op
        # spinning
        (place(op="JUMP_BACKWARD"), kernel(cpu=1.0, state="R"), Silence.SPINNING),
        (place(op="JUMP_BACKWARD"), kernel(cpu=1.0, io_bytes=200), Silence.SPINNING),
        (
            StackView(place(op="JUMP_BACKWARD"), samples=4, gil_busy=4),
            kernel(cpu=0.1, state="R", run_wait_s=0.9),
            Silence.SPINNING,
        ),  # starved of CPU by other load, but the loop holds the interpreter lock
        (
            StackView(place("flag", "check"), samples=4, gil_busy=4),
            kernel(cpu=1.0),
            Silence.SPINNING,
        ),  # a loop over a C method: the interpreter lock shows Python running
        # waiting on a peer or the device: never work, whatever the CPU does
        (place("dist", "all_reduce"), kernel(cpu=1.0), Silence.PEER_WAIT),
        (place("torch", "cuda", "synchronize"), kernel(cpu=1.0), Silence.PEER_WAIT),
        (StackView(place("loss", "item"), work=0), kernel(), Silence.PEER_WAIT),
        # waiting on an external source
        (
            place("sock", "recv"),
            kernel(syscall="recvfrom", target="socket 10.0.0.5:9000"),
            Silence.SOURCE_WAIT,
        ),
        (
            place("f", "read"),
            kernel(state="D", syscall="read", target="/mnt/nfs/x"),
            Silence.SOURCE_WAIT,
        ),
        # unclear
        (place("time", "sleep"), kernel(cpu=1.5), Silence.UNCLEAR),  # another thread computes
        (None, kernel(cpu=1.0, state="R"), Silence.UNCLEAR),  # no stack to look at
    ],
)
def test_each_class(stack: Place | StackView | None, k: KernelView, expected: Silence) -> None:
    assert silence_of(stack, k) is expected


def test_the_source_of_a_stalled_read_is_named() -> None:
    e = classify_process(
        window(place("sock", "recv"), kernel(syscall="recvfrom", target="socket 10.0.0.5:9000"))
    )
    assert e.source == "network: socket 10.0.0.5:9000"
    e = classify_process(
        window(place("f", "read"), kernel(state="D", syscall="read", target="/mnt/nfs/shard-7"))
    )
    assert e.source == "filesystem: /mnt/nfs/shard-7"
    assert "nothing arriving" in e.why


def test_a_late_heartbeat_leaves_the_kernel_to_decide() -> None:
    stale = StackView(place(op="JUMP_BACKWARD"), fresh=False, samples=4)
    # Off the CPU and nothing moving: blocked whatever the old stack said (a C deadlock).
    assert silence_of(stale, kernel(syscall="futex")) is Silence.BLOCKED
    # Busy, or waiting for a CPU: the old stack cannot tell a spin from work.
    assert silence_of(stale, kernel(cpu=1.0, state="R")) is Silence.UNCLEAR
    assert silence_of(stale, kernel(state="R", run_wait_s=0.8)) is Silence.UNCLEAR
    # Python running through many places calling no library: work or a spin, unclear.
    many = StackView(place(op="JUMP_BACKWARD"), samples=4, gil_busy=4, places=9)
    assert silence_of(many, kernel(cpu=1.0)) is Silence.UNCLEAR
    # Heartbeats long in transit: the supervisor, not the job, is short of CPU.
    behind = StackView(place(op="JUMP_BACKWARD"), fresh=False, lag_s=3.0)
    e = classify_process(window(behind, kernel(cpu=0.0)))
    assert e.silence is Silence.UNCLEAR and "supervisor is short of CPU" in e.why


def test_the_kernel_alone_names_the_wait_of_a_process_without_a_probe() -> None:
    assert kernel_kind(kernel(syscall="recvfrom")).value == "socket"
    assert kernel_kind(kernel(syscall="read", target="socket 1.2.3.4:80")).value == "socket"
    assert kernel_kind(kernel(syscall="read", target="pipe")).value == "lock"
    assert kernel_kind(kernel(syscall="wait4")).value == "child"
    assert silence_of(None, kernel(syscall="futex")) is Silence.BLOCKED
    assert silence_of(None, kernel(syscall="read", target="/data/x", state="D")) is (
        Silence.SOURCE_WAIT
    )


def test_gpu_activity_is_work_unless_the_thread_waits() -> None:
    assert silence_of(place(op="CALL"), kernel(), gpu_busy=True) is Silence.WORK
    assert silence_of(place("dist", "all_reduce"), kernel(), gpu_busy=True) is Silence.PEER_WAIT


def test_new_code_is_work_but_not_a_new_wait() -> None:
    moving = StackView(place(op="JUMP_BACKWARD"), samples=4, gil_busy=4, novel=True)
    assert silence_of(moving, kernel(cpu=1.0)) is Silence.WORK
    waiting = StackView(place("lock", "acquire"), novel=True)
    assert silence_of(waiting, kernel()) is Silence.BLOCKED


# --- the job ------------------------------------------------------------------------------------


def test_one_working_process_keeps_the_job_working() -> None:
    """Rank 0 evaluates while rank 1 waits in a barrier; DataLoader workers fetch
    while the trainer waits for them."""
    job = classify_job(
        [
            window(place("dist", "barrier"), kernel(), pid=2),
            window(StackView(place("model"), work=30), kernel(cpu=1.0), pid=1),
        ]
    )
    assert job.silence is Silence.WORK and job.culprit is not None and job.culprit.pid == 1
    job = classify_job(
        [
            window(Place(("q.py:1 get",), ("queue",)), kernel(), pid=1),
            window(
                place("sock", "recv"), kernel(syscall="recvfrom", wakeups=2), pid=2, role="worker"
            ),
        ]
    )
    assert job.silence is Silence.WORK


def test_the_culprit_of_a_hang_is_the_process_not_waiting_on_the_others() -> None:
    job = classify_job(
        [
            window(place("dist", "all_reduce"), kernel(), pid=1),  # rank 0 waits for rank 1
            window(place("time", "sleep"), kernel(), pid=2),  # rank 1 never comes
        ]
    )
    assert job.silence is Silence.BLOCKED and job.culprit is not None and job.culprit.pid == 2
    assert job.silence.hang
    job = classify_job(
        [
            window(Place(("q.py:1 get",), ("queue",)), kernel(), pid=1),
            window(
                place("sock", "recv"),
                kernel(syscall="recvfrom", target="socket 10.1.1.1:443"),
                pid=2,
                role="worker",
            ),
        ]
    )
    assert job.silence is Silence.SOURCE_WAIT and job.source == "network: socket 10.1.1.1:443"
    assert "worker 2" in job.why
    data = job.to_data()
    assert data["silence"] == "source_wait" and len(data["processes"]) == 2  # type: ignore[arg-type]


def test_an_unclear_process_makes_the_job_unclear() -> None:
    job = classify_job(
        [window(place("time", "sleep"), kernel(), pid=1), window(None, kernel(cpu=1.0), pid=2)]
    )
    assert job.silence is Silence.UNCLEAR
    assert classify_job([]).silence is Silence.UNCLEAR


def test_a_sidecar_without_a_probe_does_not_keep_a_hung_job_alive() -> None:
    """A metrics uploader chatting on the network is no work of the training job;
    a child the trainer waits for (a download) is."""
    sidecar = ProcessWindow(99, "unknown", None, False, kernel(cpu=0.5, io_bytes=50_000))
    job = classify_job([window(place("time", "sleep"), kernel(), pid=1), sidecar])
    assert job.silence is Silence.BLOCKED
    job = classify_job([window(place("subprocess", "run"), kernel(), pid=1), sidecar])
    assert job.silence is Silence.WORK
