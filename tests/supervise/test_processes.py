"""Routing probe messages: records to every sink, process messages to the table and the record."""

from __future__ import annotations

from typing import Any

from trainmedic.channel.wire import Goodbye, Heartbeat, Hello, TorchInfo
from trainmedic.record.types import LoaderActivity, LoaderInfo, RunEvent, StepRecord
from trainmedic.supervise.observe.processes import MessageRouter, ProcessTable


class ListSink:
    def __init__(self) -> None:
        self.got: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("add_"):
            return lambda value: self.got.append((name[4:], value))
        raise AttributeError(name)


def make_hello(pid: int = 5, role: str = "process") -> Hello:
    return Hello(
        pid=pid,
        ppid=4,
        role=role,
        argv=("train.py",),
        rank=0,
        local_rank=0,
        python="3.11",
        executable="python",
        t=1.0,
    )


def test_records_reach_every_sink() -> None:
    a, b = ListSink(), ListSink()
    router = MessageRouter([a, b], ProcessTable(), wall=lambda: 9.0)  # type: ignore[list-item]
    step = StepRecord(step=1, t=2.0, duration_s=0.1, pid=5)
    info = LoaderInfo(
        t=1.0,
        pid=5,
        loader_id=1,
        num_workers=0,
        batch_size=8,
        pin_memory=False,
        prefetch_factor=None,
        persistent_workers=False,
    )
    activity = LoaderActivity(t=1.0, pid=6, counts={"idle": 1})
    for message in (step, info, activity):
        router.on_message(message)
    expected = [("step", step), ("loader", info), ("loader_activity", activity)]
    assert a.got == expected and b.got == expected


def test_a_process_start_becomes_an_event_with_its_pids() -> None:
    sink = ListSink()
    table = ProcessTable()
    router = MessageRouter([sink], table, wall=lambda: 9.0)  # type: ignore[list-item]
    router.on_message(make_hello())
    router.on_message(make_hello(role="worker"))  # a spawned process turning into a worker
    (_, start), (_, role) = sink.got
    assert isinstance(start, RunEvent) and start.kind == "process_start"
    assert (start.data["pid"], start.data["ppid"], start.data["role"]) == (5, 4, "process")
    assert role.kind == "process_role"
    state = table.get(5)
    assert state is not None and state.hello.role == "worker"


def test_heartbeats_torch_and_goodbyes_update_the_table() -> None:
    sink = ListSink()
    table = ProcessTable()
    router = MessageRouter([sink], table, wall=lambda: 9.0)  # type: ignore[list-item]
    router.on_message(make_hello())
    beat = Heartbeat(pid=5, t=3.0, steps=4, phase="train", activity="data", stack=(), cpu_s=1.0)
    router.on_message(beat)
    torch = TorchInfo(
        pid=5,
        t=2.0,
        version="2.4.0",
        cuda_version="12.4",
        cudnn_version=None,
        cuda_initialized=False,
    )
    router.on_message(torch)
    router.on_message(Goodbye(pid=5, t=4.0))
    state = table.get(5)
    assert state is not None
    assert (state.last_heartbeat, state.torch, state.exited_at) == (beat, torch, 4.0)
    assert table.torch_info() == torch
    assert [e.kind for _, e in sink.got] == ["process_start", "process_exit"]


def test_a_goodbye_with_the_probes_usage_puts_it_in_the_exit_event() -> None:
    sink = ListSink()
    router = MessageRouter([sink], ProcessTable(), wall=lambda: 9.0)  # type: ignore[list-item]
    router.on_message(make_hello())
    router.on_message(
        Goodbye(pid=5, t=4.0, probe_cpu_s=0.02, probe_wall_s=10.0, stack_samples=120)
    )
    exit_event = sink.got[-1][1]
    assert exit_event.kind == "process_exit"
    assert exit_event.data == {"probe_cpu_s": 0.02, "probe_wall_s": 10.0, "stack_samples": 120}


def test_channel_problems_become_events() -> None:
    sink = ListSink()
    router = MessageRouter([sink], ProcessTable(), wall=lambda: 9.0)  # type: ignore[list-item]
    router.on_problem("channel: refused a connection without the run token")
    ((_, event),) = sink.got
    assert (event.kind, event.t) == ("channel_error", 9.0)


def test_a_process_that_sent_a_train_step_is_a_training_process_without_a_heartbeat() -> None:
    from trainmedic.supervise.observe.observers import _roles
    from trainmedic.supervise.observe.threads import ROLE_TRAIN

    table = ProcessTable()
    router = MessageRouter([ListSink()], table, wall=lambda: 9.0)  # type: ignore[list-item]
    for pid in (5, 6):
        router.on_message(make_hello(pid))
    # Its heartbeats may be seconds apart while its steps flow through the ring.
    router.on_message(StepRecord(step=1, t=2.0, duration_s=0.1, pid=6, phase="eval"))
    assert _roles(table) == {}  # an evaluation's steps alone say nothing of training
    router.on_message(StepRecord(step=1, t=2.0, duration_s=0.1, pid=5))
    assert _roles(table) == {5: ROLE_TRAIN}
    state = table.get(5)
    assert state is not None and state.trains and state.last_heartbeat is None


def test_a_process_that_trains_or_reads_a_dataloader_is_worth_sampling() -> None:
    table = ProcessTable()
    router = MessageRouter([ListSink()], table, wall=lambda: 9.0)  # type: ignore[list-item]
    for pid in (5, 6, 7):
        router.on_message(make_hello(pid))
    router.on_message(StepRecord(step=1, t=2.0, duration_s=0.1, pid=5))
    router.on_message(
        LoaderInfo(t=1.0, pid=6, loader_id=1, num_workers=0, batch_size=8, pin_memory=False,
                   prefetch_factor=None, persistent_workers=False)
    )  # fmt: skip
    sampled = {pid: s.sampled for pid, s in table.snapshot().items()}
    assert sampled == {5: True, 6: True, 7: False}  # 7: a launcher, say
    state = table.get(6)
    assert state is not None and state.loads and not state.trains
    since = {pid: s.sampled_since for pid, s in table.snapshot().items()}
    assert since == {5: 9.0, 6: 9.0, 7: None}  # the router's clock when it first did
