"""Per-thread scheduler counters: parsed from the kernel's text, read for real processes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from trainmedic.host.schedstat import TaskTimes, parse_schedstat, read_tasks, schedstat_available


def test_parse_reads_run_wait_and_slices() -> None:
    assert parse_schedstat("123456789 2000 17\n") == TaskTimes(123456789, 2000, 17)


@pytest.mark.parametrize("text", ["", "1 2", "a b c", "-1 2 3", "1 2 x"])
def test_parse_refuses_what_is_not_three_counters(text: str) -> None:
    assert parse_schedstat(text) is None


def test_read_tasks_of_a_fake_proc_tree(tmp_path: Path) -> None:
    for tid, text in ((10, "5 6 7"), (11, "8 9 10"), (12, "garbage")):
        d = tmp_path / "10" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(text)
    (tmp_path / "10" / "task" / "not-a-tid").mkdir()
    assert read_tasks(10, proc=str(tmp_path)) == {10: TaskTimes(5, 6, 7), 11: TaskTimes(8, 9, 10)}
    assert read_tasks(99, proc=str(tmp_path)) == {}


@pytest.mark.skipif(not schedstat_available(), reason="kernel keeps no scheduler statistics")
def test_read_tasks_sees_every_thread_of_this_process_and_their_cpu() -> None:
    stop = threading.Event()
    ready = threading.Event()
    native: list[int] = []

    def spin() -> None:
        native.append(threading.get_native_id())
        ready.set()
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    ready.wait(10)
    try:
        first = read_tasks(os.getpid())
        before = first[native[0]].run_ns
        deadline = os.times().elapsed + 30
        while read_tasks(os.getpid())[native[0]].run_ns - before < 20_000_000:
            assert os.times().elapsed < deadline, "the spinning thread got no CPU"
        assert os.getpid() in first  # the main thread's id is the pid
    finally:
        stop.set()
        t.join()
