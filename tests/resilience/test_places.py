"""Where a thread is parked, from its frames, modules, callee and instruction."""

from __future__ import annotations

import pytest

from trainmedic.resilience.places import Place, PlaceKind, classify_place, native_op

USER = "__main__"


def at(
    calls: tuple[str, ...] = (),
    op: str = "CALL",
    frames: tuple[tuple[str, str], ...] = (("train.py:42 main", USER),),
) -> Place:
    return Place(tuple(f for f, _ in frames), tuple(m for _, m in frames), calls, op)


def inside(*modules: str, calls: tuple[str, ...] = (), op: str = "CALL") -> Place:
    """Library frames (innermost first) called from the user's script."""
    frames = tuple((f"{m.replace('.', '/')}.py:10 f", m) for m in modules)
    return at(calls, op, (*frames, ("train.py:42 main", USER)))


@pytest.mark.parametrize(
    ("place", "kind"),
    [
        (at(("time", "sleep")), PlaceKind.SLEEP),
        (at(("lock", "acquire")), PlaceKind.LOCK),
        (inside("threading", calls=("waiter", "acquire")), PlaceKind.LOCK),  # Event.wait
        (inside("queue", "threading"), PlaceKind.LOCK),
        (
            inside("selectors", "multiprocessing.connection", "torch.utils.data.dataloader"),
            PlaceKind.LOCK,  # a trainer waiting for its DataLoader workers
        ),
        (inside("selectors", "subprocess"), PlaceKind.CHILD),
        (at(("os", "waitpid")), PlaceKind.CHILD),
        (inside("torch.distributed.distributed_c10d", calls=("work", "wait")), PlaceKind.PEER),
        (at(("dist", "all_reduce")), PlaceKind.PEER),
        (at(("dist", "barrier")), PlaceKind.PEER),
        (at(("torch", "cuda", "synchronize")), PlaceKind.DEVICE),
        (at(("loss", "item")), PlaceKind.DEVICE),
        (inside("socket", "http.client", calls=("self", "_sock", "recv_into")), PlaceKind.SOCKET),
        (inside("selectors", "urllib3.connection"), PlaceKind.SOCKET),
        (at(("sock", "recv")), PlaceKind.SOCKET),
        (at(("conn", "read")), PlaceKind.SOCKET),
        (inside("torch.serialization", calls=("zip_file", "write_record")), PlaceKind.FILE),
        (at(("os", "fsync")), PlaceKind.FILE),
        (at(("f", "write")), PlaceKind.FILE),
        (at(("np", "load")), PlaceKind.FILE),
        (inside("json.encoder", "json"), PlaceKind.FILE),
        (at(("torch", "linalg", "eigh")), PlaceKind.COMPUTE),
        (inside("torch.nn.modules.linear", calls=("F", "linear")), PlaceKind.COMPUTE),
        (at((), op="BINARY_OP"), PlaceKind.COMPUTE),  # a @ b on big tensors
        (at(("x", "matmul")), PlaceKind.COMPUTE),  # a method of unknown nature, parked
        (at((), op="JUMP_BACKWARD"), PlaceKind.PYTHON),  # while True: x += 1
        (at((), op="POP_JUMP_BACKWARD_IF_TRUE"), PlaceKind.PYTHON),  # 3.11: while x >= 0: ...
        (at((), op="JUMP_ABSOLUTE"), PlaceKind.PYTHON),  # 3.10
        (at((), op="NOP"), PlaceKind.PYTHON),
        (at((), op="BINARY_SUBSCR"), PlaceKind.COMPUTE),
        (at(("len",), op="PRECALL"), PlaceKind.PYTHON),
        (at(("lock", "locked"), op="CALL"), PlaceKind.PYTHON),  # a cheap builtin
        (at(("helper",), op="RESUME"), PlaceKind.PYTHON),
        (Place(), PlaceKind.UNKNOWN),
    ],
)
def test_each_kind_of_place(place: Place, kind: PlaceKind) -> None:
    assert classify_place(place) is kind


def test_checkpoint_and_elastic_modules_are_no_collective() -> None:
    # torch.distributed.checkpoint writes files; the elastic agent sleeps between checks.
    dcp = inside("torch.distributed.checkpoint.filesystem", calls=("f", "write"))
    assert classify_place(dcp) is PlaceKind.FILE
    assert (
        classify_place(
            inside("torch.distributed.elastic.agent.server.api", calls=("time", "sleep"))
        )
        is PlaceKind.SLEEP
    )


def test_waiting_kinds_and_io_kinds() -> None:
    assert {k for k in PlaceKind if k.waits} == {
        PlaceKind.SLEEP,
        PlaceKind.LOCK,
        PlaceKind.CHILD,
        PlaceKind.PEER,
        PlaceKind.DEVICE,
    }
    assert {k for k in PlaceKind if k.io} == {PlaceKind.SOCKET, PlaceKind.FILE}


def test_native_op_and_description() -> None:
    assert native_op(at((), op="BINARY_OP"))
    assert not native_op(at((), op="JUMP_BACKWARD"))
    assert not native_op(at(("f",), op="CALL"))
    assert at(("time", "sleep")).describe() == "`time.sleep` at train.py:42 main"
    assert at((), op="JUMP_BACKWARD").describe() == "train.py:42 main"
