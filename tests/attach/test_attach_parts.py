"""The pieces of ``trainmedic attach`` on hand-made input: py-spy's raw lines, the parts
of a training step a stack is in, the call a line makes, the right to read a process,
and the names of a job's processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.attach.access import read_problem
from trainmedic.attach.parts import part_of
from trainmedic.attach.spy import Frame, parse_raw
from trainmedic.attach.states import calls as _calls
from trainmedic.attach.tree import _roles

SITE = "/venv/lib/python3.11/site-packages"


def test_raw_lines_become_each_threads_stacks_innermost_first() -> None:
    text = (
        'process 12:"python /t/train.py --lr 0.1";thread (12): MainThread;'
        "<module> (/t/train.py:40);fetch (/t/train.py:12) 72\n"
        'process 12:"python /t/train.py --lr 0.1";thread (12): MainThread;'
        "<module> (/t/train.py:40);fetch (/t/train.py:12) 3\n"
        'process 13:"python -c x";thread (99): Thread-1 (work);run (/usr/lib/threading.py:982) 5\n'
        "garbage that is no sample\n"
    )
    threads, commands = parse_raw(text)
    main = threads[(12, 12)]
    assert main.name == "MainThread" and main.total == 75
    (stack,) = main.stacks
    assert stack == (Frame("fetch", "/t/train.py", 12), Frame("<module>", "/t/train.py", 40))
    assert threads[(13, 99)].name == "Thread-1 (work)"
    assert commands == {12: "python /t/train.py --lr 0.1", 13: "python -c x"}


def test_a_childs_samples_belong_to_the_child_not_to_its_parent() -> None:
    # py-spy --subprocesses names a DataLoader worker's samples by its chain of processes,
    # the parent first: they are the worker's, or its reads look like the loop's own.
    text = (
        'process 7:"python train.py";process 8:"python train.py";thread (8): MainThread;'
        "_worker_loop (/torch/utils/data/_utils/worker.py:300);read (/t/data.py:5) 40\n"
        'process 7:"python train.py";thread (7): MainThread;main (/t/train.py:9) 60\n'
        'process 1:"bash -c \"a;b\"";process 7:"python a;b";process 9:"x";'
        "thread (9): T;f (/x.py:1) 2\n"
    )
    threads, commands = parse_raw(text)
    assert sorted(threads) == [(7, 7), (8, 8), (9, 9)]
    assert threads[(8, 8)].total == 40 and threads[(7, 7)].total == 60
    assert commands == {7: "python train.py", 8: "python train.py", 9: "x"}


@pytest.mark.parametrize(
    ("files", "part"),
    [
        ([f"{SITE}/torch/utils/data/_utils/fetch.py", f"{SITE}/torch/utils/data/dataloader.py",
          "/t/train.py"], "data_in_process"),
        ([f"{SITE}/torch/utils/data/dataloader.py", "/t/train.py"], "data_wait"),
        ([f"{SITE}/torch/autograd/graph.py", f"{SITE}/torch/_tensor.py", "/t/train.py"],
         "backward"),
        ([f"{SITE}/torch/optim/sgd.py", "/t/train.py"], "optimizer"),
        ([f"{SITE}/torch/nn/modules/linear.py", f"{SITE}/torch/nn/modules/module.py",
          "/t/train.py"], "forward"),
        ([f"{SITE}/torch/distributed/distributed_c10d.py", "/t/train.py"], "collective"),
        (["/usr/lib/python3.11/logging/__init__.py", "/t/train.py"], "host"),
    ],
)  # fmt: skip
def test_a_stack_is_in_the_part_its_frames_say(files: list[str], part: str) -> None:
    assert part_of(tuple(Frame("f", f, 1) for f in files)) == part


def test_the_call_a_line_makes_is_read_from_the_source(tmp_path: Path) -> None:
    src = tmp_path / "job.py"
    src.write_text("import time\nwhile True:\n    self.lock.acquire(timeout=-1)\n"
                   "    time.sleep(0.5)\nwith open('x') as f:\n")  # fmt: skip
    assert _calls(Frame("f", str(src), 3)) == ("self", "lock", "acquire")
    assert _calls(Frame("f", str(src), 4)) == ("time", "sleep")
    assert _calls(Frame("f", str(src), 5)) == ("open",)
    assert _calls(Frame("f", str(src), 2)) == ()
    assert _calls(Frame("f", str(tmp_path / "gone.py"), 1)) == ()


def _proc(tmp_path: Path, scope: int | None, uid: int = 1000, cap: bool = False) -> str:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(f"CapEff:\t{1 << 19 if cap else 0:016x}\n")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text(f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if scope is not None:
        (tmp_path / "sys" / "kernel" / "yama").mkdir(parents=True)
        (tmp_path / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{scope}\n")
    return str(tmp_path)


@pytest.mark.parametrize(
    ("scope", "uid", "cap", "says"),
    [
        (0, 1000, False, None),
        (None, 1000, False, None),
        (1, 1000, False, "ptrace_scope is 1"),
        (2, 1000, False, "ptrace_scope is 2"),
        (3, 1000, True, None),
        (0, 0, False, "belongs to user 0"),
        (1, 0, True, None),
    ],
)
def test_the_right_to_read_a_process_and_how_to_get_it(
    tmp_path: Path, scope: int | None, uid: int, cap: bool, says: str | None
) -> None:
    got = read_problem(42, proc=_proc(tmp_path, scope, uid, cap), uid=1000)
    if says is None:
        assert got is None
    else:
        assert got is not None and says in got and ("sudo" in got or "reboot" in got)


@pytest.mark.parametrize(("job_uid", "says"), [(1000, "--cap-add SYS_PTRACE"), (0, None)])
def test_root_without_the_capability_is_told_of_the_capability_not_of_sudo(
    tmp_path: Path, job_uid: int, says: str | None
) -> None:
    # A container's root without CAP_SYS_PTRACE reads its own (root's) processes, not others'.
    got = read_problem(42, proc=_proc(tmp_path, 0, job_uid), uid=0)
    if says is None:
        assert got is None
    else:
        assert got is not None and says in got and "CAP_SYS_PTRACE" in got and "sudo" not in got


def test_processes_are_named_launcher_training_and_worker() -> None:
    py = ("python", "train.py")
    facts = {
        10: (1, ("bash", "run.sh"), False, False, None),
        11: (10, ("/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"), True, True, None),
        12: (11, py, True, True, 0),
        13: (11, py, True, True, 1),
        14: (12, py, True, True, None),  # rank 0's DataLoader worker
        15: (10, ("tee", "log"), False, False, None),
    }
    assert _roles(10, facts) == {10: "launcher", 11: "launcher", 12: "training",
                                 13: "training", 14: "worker", 15: "other"}  # fmt: skip


def test_a_torch_launcher_not_known_by_name_is_seen_by_its_ranks() -> None:
    py = ("python", "train.py")
    facts = {
        20: (1, ("python", "launch_all.py"), True, True, None),
        21: (20, py, True, True, 0),
        22: (20, py, True, True, 1),
    }
    assert _roles(20, facts) == {20: "launcher", 21: "training", 22: "training"}
