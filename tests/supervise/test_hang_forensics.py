"""Reading stack dumps and saying where a job hung."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmedic.supervise.hang import forensics
from trainmedic.supervise.hang.stack_dumps import (
    JobProcess,
    ProcessStacks,
    StackFrame,
    ThreadStack,
    parse_faulthandler_text,
    read_stacks,
    summarize_stacks,
)

SITE = "/usr/lib/python3.11/site-packages"
TEXT = f"""
=== trainmedic: stacks of pid 41 (process) ===
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/home/me/train.py", line 88 in main
  File "/home/me/train.py", line 120 in <module>

=== trainmedic: stacks of pid 42 (worker) ===
Current thread 0x00007f0000000003 (most recent call first):
  File "/home/me/data.py", line 12 in __getitem__
  File "{SITE}/torch/utils/data/_utils/worker.py", line 308 in _worker_loop
"""


def make_thread(*frames: StackFrame, training: bool = True) -> ThreadStack:
    return ThreadStack(1, "MainThread", True, training, tuple(frames))


def test_faulthandler_text_is_parsed_per_process_and_thread() -> None:
    parsed = parse_faulthandler_text(TEXT)
    assert sorted(parsed) == [41, 42]
    role, threads = parsed[41]
    assert role == "process"
    assert [t.ident for t in threads] == [0x7F0000000002, 0x7F0000000001]
    helper, main = threads
    assert not helper.main and main.main  # the main thread is not started by threading
    assert main.frames[0] == StackFrame(
        f"{SITE}/torch/distributed/distributed_c10d.py", 2501, "all_reduce"
    )
    assert main.frames[1].where() == "me/train.py:88 in main"
    assert parsed[42][0] == "worker"


def test_a_dump_of_the_signalled_thread_alone_is_the_main_thread() -> None:
    # What the probe writes: only the thread the signal interrupted, with no id,
    # which is the main thread even when it runs inside a thread-started frame.
    text = """
=== trainmedic: stacks of pid 43 (process) ===
Stack (most recent call first):
  File "/home/me/train.py", line 50 in spin
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap
"""
    role, threads = parse_faulthandler_text(text + TEXT)[43]
    assert role == "process" and len(threads) == 1
    (thread,) = threads
    assert thread.main and thread.ident == 0
    assert thread.frames[0] == StackFrame("/home/me/train.py", 50, "spin")


def test_a_hang_in_a_library_names_the_call_and_the_users_line() -> None:
    _, threads = parse_faulthandler_text(TEXT)[41]
    lead = ProcessStacks(41, "process", "faulthandler", threads)
    summary, location = summarize_stacks(lead)
    assert summary == (
        "hung in `torch.distributed.distributed_c10d.all_reduce` called from me/train.py:88 in main"
    )
    assert location == "/home/me/train.py:88 in main"


def test_the_call_the_users_frame_makes_is_named_as_written() -> None:
    lead = ProcessStacks(
        7,
        "process",
        "json",
        (
            make_thread(
                StackFrame("/usr/lib/python3.11/threading.py", 320, "wait"),
                StackFrame("/home/me/train.py", 30, "main", ("t", "join")),
            ),
        ),
    )
    summary, location = summarize_stacks(lead)
    assert summary == "hung in `t.join` called from me/train.py:30 in main"
    assert location == "/home/me/train.py:30 in main"


def test_a_hung_worker_is_named_after_the_main_thread() -> None:
    parsed = parse_faulthandler_text(TEXT)
    lead = ProcessStacks(41, "process", "faulthandler", parsed[41][1])
    worker = ProcessStacks(42, "worker", "faulthandler", parsed[42][1])
    summary, _ = summarize_stacks(lead, [worker])
    assert summary.endswith("; DataLoader worker 42 at me/data.py:12 in __getitem__")


def test_without_any_stack_the_summary_says_so() -> None:
    assert summarize_stacks(None) == ("hung; no stack could be read (no probe in the job?)", None)


def test_json_dumps_win_over_text_and_heartbeats_fill_in(tmp_path: Path) -> None:
    (tmp_path / "stacks.txt").write_text(TEXT)
    (tmp_path / "stacks-41.json").write_text(
        json.dumps(
            {
                "pid": 41,
                "role": "process",
                "threads": [
                    {
                        "ident": 1,
                        "name": "MainThread",
                        "main": True,
                        "training": True,
                        "frames": [
                            {
                                "file": "/home/me/train.py",
                                "line": 9,
                                "function": "f",
                                "calls": ["time", "sleep"],
                            }
                        ],
                    }
                ],
            }
        )
    )
    processes = [
        JobProcess(41, "process"),
        JobProcess(42, "worker"),
        JobProcess(43, "process", ("train.py:5 main", "train.py:9 <module>")),
        JobProcess(44, "unknown"),
    ]
    stacks = {s.pid: s for s in read_stacks(tmp_path, processes)}
    assert sorted(stacks) == [41, 42, 43]
    assert stacks[41].source == "json"
    assert stacks[41].focus is not None and stacks[41].focus.frames[0].calls == ("time", "sleep")
    assert stacks[42].source == "faulthandler"
    assert stacks[43].source == "heartbeat"
    assert stacks[43].focus is not None
    assert stacks[43].focus.frames[0] == StackFrame("train.py", 5, "main")


def test_py_spy_is_found_beside_the_interpreter_of_an_inactive_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").touch()
    spy = bin_dir / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(0o755)
    monkeypatch.setattr(forensics.sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert forensics.find_py_spy() == str(spy)
    spy.unlink()
    monkeypatch.setattr(forensics.sysconfig, "get_path", lambda name: str(tmp_path / "none"))
    assert forensics.find_py_spy() is None


def test_without_py_spy_the_hang_file_says_which_extra_brings_it(tmp_path: Path) -> None:
    captured = forensics.capture_hang(
        tmp_path,
        [JobProcess(pid=2**22 + 7, role="unknown")],  # no such process: nothing to signal
        lead_pid=None,
        verdict={"kind": "hang"},
        py_spy=None,
        sleep=lambda s: None,
    )
    note = "py-spy is not installed: no native stacks (pip install 'trainmedic[native]')"
    assert note in captured.notes
    assert json.loads((tmp_path / "hang.json").read_text())["notes"] == list(captured.notes)
    assert (tmp_path / "hang.json").stat().st_mode & 0o777 == 0o600
