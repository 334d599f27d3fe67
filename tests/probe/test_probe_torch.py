"""The probe on real, unmodified training scripts (CPU torch), in real child processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .probed import SCRIPTS, ProbedRun, run_probed

DELAY_S = 0.004  # per sample in slow_loader.py's dataset
BATCH = 8


def script(name: str, *args: object) -> list[str]:
    return [sys.executable, str(SCRIPTS / name), *(str(a) for a in args)]


@pytest.fixture(scope="module")
def slow_loader(tmp_path_factory: pytest.TempPathFactory) -> ProbedRun:
    run_dir = tmp_path_factory.mktemp("slow_loader")
    return run_probed(script("slow_loader.py", 12, DELAY_S, 0, BATCH), run_dir)


def test_optimizer_steps_are_counted(slow_loader: ProbedRun) -> None:
    assert slow_loader.proc.returncode == 0, slow_loader.proc.stderr
    assert slow_loader.proc.stdout == "done 12\n"
    steps = slow_loader.steps
    assert [s.step for s in steps] == list(range(1, 13))
    assert {(s.source, s.phase) for s in steps} == {("optimizer", "train")}
    assert {s.samples for s in steps} == {BATCH}
    assert {s.pid for s in steps} == {slow_loader.hellos[0].pid}


def test_data_wait_is_the_time_blocked_on_the_loader(slow_loader: ProbedRun) -> None:
    for s in slow_loader.steps:
        # The dataset spins DELAY_S per sample on the wall clock: a hard lower bound.
        assert BATCH * DELAY_S * 0.95 <= s.data_wait_s <= s.duration_s
        assert s.compute_s is not None and s.compute_s > 0
        assert s.data_wait_s + s.compute_s <= s.duration_s * 1.001
    total = sum(s.duration_s for s in slow_loader.steps)
    assert sum(s.data_wait_s for s in slow_loader.steps) / total > 0.5


def test_loader_settings_are_recorded_once(slow_loader: ProbedRun) -> None:
    (info,) = slow_loader.loaders
    assert (info.num_workers, info.batch_size, info.pin_memory, info.persistent_workers) == (
        0,
        BATCH,
        False,
        False,
    )
    assert info.prefetch_factor is None
    assert info.dataset_type == "__main__.SlowDataset"
    assert info.dataset_len == 12 * BATCH


def test_loading_time_is_attributed_to_the_dataset_transform(slow_loader: ProbedRun) -> None:
    counts: dict[str, int] = {}
    for a in slow_loader.activity:
        for state, n in a.counts.items():
            counts[state] = counts.get(state, 0) + n
    assert counts.get("transform", 0) > 0
    assert counts["transform"] >= 0.8 * sum(counts.values())
    frames = {k for a in slow_loader.activity for k in a.top_frames}
    assert any("slow_loader.py" in k and "__getitem__" in k for k in frames)


def test_the_probe_reports_no_errors(slow_loader: ProbedRun) -> None:
    assert [e for e in slow_loader.events if e.kind == "probe_error"] == []
    assert slow_loader.problems == []
    assert slow_loader.goodbyes


def test_the_goodbye_tells_what_the_probes_threads_used(slow_loader: ProbedRun) -> None:
    (bye,) = slow_loader.goodbyes
    assert bye.probe_cpu_s is not None and bye.probe_wall_s is not None
    # Two threads (sending, stack sampling) can use at most two cores' worth.
    assert 0.0 < bye.probe_cpu_s <= 2 * bye.probe_wall_s
    # The job waits for data most of the time: its stacks were sampled.
    assert bye.stack_samples is not None and bye.stack_samples > 0


def test_steps_without_an_optimizer_come_from_backward_calls(tmp_path: Path) -> None:
    prep_s = 0.02
    run = run_probed(script("manual_update.py", 8, prep_s), tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    steps = run.steps
    assert len(steps) == 8
    assert {s.source for s in steps} == {"backward"}
    assert {s.samples for s in steps} == {12}
    for s in steps[1:]:
        # No DataLoader: the batch preparation between steps is the data wait.
        assert s.data_wait_s >= prep_s * 0.95
        assert s.compute_s is not None


def test_a_closure_optimizer_counts_one_step_per_optimizer_step(tmp_path: Path) -> None:
    run = run_probed(script("lbfgs.py", 5), tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    calls = int(run.proc.stdout.split()[-1])
    assert calls > 5  # the closure ran several times per step ...
    assert [s.step for s in run.steps] == [1, 2, 3, 4, 5]  # ... but steps are steps
    assert {s.source for s in run.steps} == {"optimizer"}
    assert {s.samples for s in run.steps} == {64}


def test_a_failing_probe_part_is_switched_off_and_the_job_goes_on(tmp_path: Path) -> None:
    run = run_probed(
        script("slow_loader.py", 6, 0.001, 0, 4),
        tmp_path,
        extra_env={"TRAINMEDIC_PROBE_INJECT_FAULT": "forward"},
    )
    assert run.proc.returncode == 0
    assert run.proc.stdout == "done 6\n"
    assert run.proc.stderr == ""
    (error,) = [e for e in run.events if e.kind == "probe_error"]
    assert error.data["part"] == "forward"
    assert "InjectedFault" in error.message
    # The other parts keep working: steps, data wait, batch sizes.
    assert [s.step for s in run.steps] == list(range(1, 7))
    assert all(s.data_wait_s > 0 for s in run.steps)


def test_a_script_without_torch_never_loads_it(tmp_path: Path) -> None:
    run = run_probed(script("no_torch.py", 100), tmp_path)
    assert run.proc.stdout.splitlines()[-1] == "torch loaded: False"
    # Only process messages, if any (a process this short may not even connect).
    assert {type(m).__name__ for m in run.messages} <= {"Hello", "Heartbeat", "Goodbye"}


def test_the_explicit_api_marks_steps_and_phases(tmp_path: Path) -> None:
    run = run_probed(script("api_phases.py", 6, 0.02), tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    train = [s for s in run.steps if s.phase == "train"]
    evaluation = [s for s in run.steps if s.phase == "eval"]
    assert [s.step for s in train] == list(range(1, 7))
    assert {s.source for s in run.steps} == {"api"}
    (e,) = evaluation
    assert e.duration_s >= 0.06
    # The evaluation's time is not part of the train step after it.
    assert train[4].duration_s < 0.06


@pytest.mark.slow
def test_dataloader_workers_report_where_loading_time_goes(tmp_path: Path) -> None:
    run = run_probed(script("slow_loader.py", 16, DELAY_S, 2, BATCH), tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    main = next(h for h in run.hellos if h.role != "worker")
    workers = {h.pid for h in run.hellos if h.role == "worker"}
    assert len(workers) == 2
    assert all(h.ppid == main.pid for h in run.hellos if h.role == "worker")
    assert {s.pid for s in run.steps} == {main.pid}  # workers never mark steps
    assert len(run.steps) == 16
    worker_counts = [a.counts for a in run.activity if a.pid in workers]
    assert sum(c.get("transform", 0) for c in worker_counts) > 0
    (info,) = run.loaders
    assert (info.num_workers, info.prefetch_factor) == (2, 2)


@pytest.mark.slow
def test_compiled_models_and_functions_keep_their_graphs_and_their_steps(tmp_path: Path) -> None:
    plain = subprocess.run(script("compiled.py", 6), capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    run = run_probed(script("compiled.py", 6), tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    # The compiled training step breaks where it breaks without the probe (backward(),
    # torch's own optimizer step): never at the probe's hooks.
    assert run.proc.stdout.splitlines() == plain.stdout.splitlines()
    assert run.proc.stdout.splitlines()[0] == "graph breaks 0"
    assert run.proc.stdout.splitlines()[-1] == "done"
    assert [s.step for s in run.steps] == list(range(1, 25))
    assert all(s.compute_s is not None and s.compute_s > 0 for s in run.steps)
    # A compiled model's call is seen; inside a compiled function the model's call is
    # part of the compiled code, whose batch no wrapper sees.
    assert {s.samples for s in run.steps[:12]} == {16}
    # The compiled training step's optimizer step runs no hook: the step the call that
    # compiled it ends when dynamo traces it, then backward calls end them.
    assert [s.source for s in run.steps[18:]] == ["optimizer"] + ["backward"] * 5
    assert [e for e in run.events if e.kind == "probe_error"] == []
