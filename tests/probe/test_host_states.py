"""Naming what the training thread does between steps when no DataLoader feeds it."""

from __future__ import annotations

import sysconfig

import pytest

from trainmedic.probe.frames import FrameInfo
from trainmedic.probe.host_states import classify_outside, name_words
from trainmedic.probe.stacks import ActivityAggregate
from trainmedic.record.sample_states import DATA_STATES, OUTSIDE_STATES

SCRIPT = "/home/me/project/train.py"
SITE = sysconfig.get_paths()["purelib"]
STDLIB = sysconfig.get_paths()["stdlib"]


def f(path: str, function: str = "main", callees: tuple[str, ...] = ()) -> FrameInfo:
    return FrameInfo(path, 1, function, callees)


@pytest.mark.parametrize(
    ("stack", "state"),
    [
        # time.sleep(0.05) in the loop, or in a helper named for it
        ([f(SCRIPT, callees=("time", "sleep"))], "sleep"),
        ([f(SCRIPT, "throttle", callees=("time", "sleep")), f(SCRIPT)], "sleep"),
        # ... but a data source polled or rate-limited is waiting for data
        ([f(SCRIPT, "fetch_batch", callees=("time", "sleep")), f(SCRIPT)], "ipc_wait"),
        # print(f"step {i} loss {loss.item():.3f}") - the print, once the item is done
        ([f(SCRIPT, callees=("print",))], "log"),
        ([f(SCRIPT, callees=("sys", "stdout", "write"))], "log"),
        # logger.info(...) from the loop: inside the logging package
        ([f(f"{STDLIB}/logging/__init__.py", "emit"), f(SCRIPT)], "log"),
        # a tqdm progress bar refreshing
        ([f(f"{SITE}/tqdm/std.py", "refresh"), f(SCRIPT)], "log"),
        # a function of the script named for logging, computing its metrics in Python
        ([f(SCRIPT, "log_batch_metrics"), f(SCRIPT)], "log"),
        # loss.item() / torch.cuda.synchronize(): waiting for the device
        ([f(SCRIPT, callees=("loss", "item"))], "sync"),
        (
            [
                f(f"{SITE}/torch/cuda/__init__.py", "synchronize", ("torch", "_C", "_sync")),
                f(SCRIPT),
            ],
            "sync",
        ),
        # torch.save inside the loop: its pickling reads like a read, but it writes
        (
            [
                f(f"{SITE}/torch/serialization.py", "persistent_id"),
                f(f"{SITE}/torch/serialization.py", "_save"),
                f(f"{SITE}/torch/serialization.py", "save"),
                f(SCRIPT),
            ],
            "file_write",
        ),
        ([f(SCRIPT, callees=("fh", "write"))], "file_write"),
        # pure-Python bookkeeping in the loop itself
        ([f(SCRIPT, "main")], "python"),
        ([f(SCRIPT, "update_ema"), f(SCRIPT, "main")], "python"),
        # building the next batch: by name, by a data library, by a tensor made from host data
        ([f(SCRIPT, "featurize"), f(SCRIPT, "<listcomp>"), f(SCRIPT)], "transform"),
        ([f(SCRIPT, "make_sentence"), f(SCRIPT)], "transform"),
        ([f("/home/me/project/data/augment.py", "jitter"), f(SCRIPT)], "transform"),
        ([f(f"{SITE}/torchvision/transforms/functional.py", "resize"), f(SCRIPT)], "transform"),
        ([f(f"{SITE}/numpy/random/__init__.py", "x"), f(SCRIPT)], "transform"),
        ([f(SCRIPT, callees=("torch", "randn"))], "transform"),
        ([f(SCRIPT, callees=("torch", "tensor"))], "transform"),
        # the batch's bytes arriving
        ([f(SCRIPT, "load_shard", callees=("np", "load"))], "file_read"),
        ([f(f"{STDLIB}/socket.py", "readinto"), f(SCRIPT)], "socket_wait"),
        ([f(SCRIPT, callees=("requests", "get"))], "socket_wait"),
        # a hand-made prefetcher: the loop waits on a queue a thread fills
        (
            [f(f"{STDLIB}/threading.py", "wait"), f(f"{STDLIB}/queue.py", "get"), f(SCRIPT)],
            "ipc_wait",
        ),
        # waiting on an event another thread sets: waiting for that thread
        (
            [f(f"{STDLIB}/threading.py", "wait", ("waiter", "acquire")), f(SCRIPT, "main")],
            "ipc_wait",
        ),
        # a stop flag checked each step (``while not stop.is_set()``): the loop runs on
        ([f(f"{STDLIB}/threading.py", "is_set"), f(SCRIPT, "main")], "python"),
        # joining a thread: not Python running, not known
        (
            [
                f(f"{STDLIB}/threading.py", "_wait_for_tstate_lock"),
                f(f"{STDLIB}/threading.py", "join"),
                f(SCRIPT, "main"),
            ],
            "other",
        ),
        ([], "other"),
    ],
)
def test_what_the_loop_does_between_steps(stack: list[FrameInfo], state: str) -> None:
    assert classify_outside(stack) == state


def test_a_dict_get_is_not_a_network_request() -> None:
    assert classify_outside([f(SCRIPT, callees=("cache", "get"))]) == "python"


def test_words_of_identifiers() -> None:
    assert name_words("makeBatch_v2") == {"make", "batch", "v", "2"}
    assert name_words("__getitem__") == {"getitem"}
    assert name_words("HTTPSampleReader") == {"http", "sample", "reader"}


def test_states_are_disjoint_and_the_aggregate_keeps_them() -> None:
    assert not set(DATA_STATES) & set(OUTSIDE_STATES)
    agg = ActivityAggregate()
    agg.add([f(SCRIPT, callees=("time", "sleep"))], "self")
    agg.add([f(SCRIPT, callees=("time", "sleep"))], "self")
    agg.add([f(SCRIPT, "featurize")], "self")
    record = agg.take(1.0, 7)
    assert record is not None
    assert record.counts["sleep"] == 2 and record.counts["transform"] == 1
    assert record.counts["other"] == 0  # the core states are always present
