"""Keras and TensorFlow jobs under ``trainmedic run``, unmodified
(``tests/tf/scripts/train_keras.py``): their steps are seen, their wait for a tf.data
pipeline is measured and its cause named in tf.data's words, evaluation and
checkpoints are phases, a job that hangs in a callback is caught and resumes where
BackupAndRestore left it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.tf.installed import needs

pytestmark = needs("tensorflow", "keras")

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_keras.py"


def _run(
    tmp: Path, mode: str, *args: str, options: tuple[str, ...] = (), script: Path = SCRIPT
) -> dict[str, Any]:
    out = tmp / "run"
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(out),
         *options, "--", sys.executable, str(script), mode, "--out", str(tmp), *args],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert (out / "findings.json").is_file(), done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {
        "rc": done.returncode,
        "findings": json.loads((out / "findings.json").read_text())["findings"],
        "steps": steps,
        "events": [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()],
        "output": done.stdout,  # the job's own output passes through trainmedic's
    }


def _input(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in found if f["id"].startswith("input.")]


def test_a_serial_map_is_named_with_the_setting_to_change(tmp_path: Path) -> None:
    r = _run(tmp_path, "serial-map", "--steps", "150")
    assert r["rc"] == 0 and "done" in r["output"]
    train = [s for s in r["steps"] if s.get("ph", "train") == "train"]
    assert len(train) == 150 and all(s["src"] == "api" for s in train)
    # The wait for the pipeline is measured: a large share of each step (about half on a
    # quiet 2-core machine; 27 % was seen where other processes took the training
    # thread's CPU 15 % of the time, which lengthens the step's compute instead).
    share = sum(s.get("w", 0.0) for s in train[10:]) / sum(s["d"] for s in train[10:])
    assert share > 0.15, (share, [(f["id"], f["title"]) for f in r["findings"]])
    inputs = _input(r["findings"])
    assert len(inputs) == 1, [(x["id"], x["title"]) for x in r["findings"]]
    f = inputs[0]
    assert f["id"] == "input.workers" and f["severity"] in ("warning", "error")
    assert "num_parallel_calls=tf.data.AUTOTUNE" in f["fix"]
    assert f["evidence"]["tfdata_pipeline"] == "TensorSlice > Map > Batch(32)"
    assert "DataLoader" not in f["fix"] and "run.no_steps" not in {x["id"] for x in r["findings"]}


@pytest.mark.slow
def test_a_generator_pipeline_is_the_interpreter_lock(tmp_path: Path) -> None:
    r = _run(tmp_path, "generator", "--steps", "60")
    (f,) = _input(r["findings"])
    assert f["id"] == "input.gil" and "from_generator" in f["title"]


@pytest.mark.slow
def test_work_redone_every_epoch_asks_for_a_cache_after_the_map(tmp_path: Path) -> None:
    r = _run(tmp_path, "uncached", "--steps", "60", "--epochs", "3")
    assert r["rc"] == 0 and "done" in r["output"]
    assert [e["data"]["how"] for e in r["events"] if e["kind"] == "tfdata_epochs"] == [
        "fit's epoch 2"
    ]
    (f,) = _input(r["findings"])
    assert f["id"] == "input.cpu" and "every epoch" in f["title"], f
    assert ".cache() right after .map(heavy)" in f["fix"]


@pytest.mark.slow
def test_an_in_memory_prefetched_pipeline_is_no_input_finding(tmp_path: Path) -> None:
    r = _run(tmp_path, "healthy", "--steps", "300", "--epochs", "2")
    assert len([s for s in r["steps"] if s.get("ph", "train") == "train"]) == 600
    assert not _input(r["findings"]), r["findings"]
    assert not [f for f in r["findings"] if f["id"].startswith("host.")], r["findings"]


@pytest.mark.slow
def test_a_custom_gradient_tape_loop_has_steps_compute_and_data_wait(tmp_path: Path) -> None:
    r = _run(tmp_path, "custom", "--steps", "80")
    train = [s for s in r["steps"] if s.get("ph", "train") == "train"]
    # One step per apply_gradients, its wait from the tf.data iterator, its compute from
    # the model's call, the tape's gradient and the optimizer.
    assert len(train) == 80 and all("src" not in s or s["src"] == "optimizer" for s in train)
    steady = train[5:]
    assert all(s.get("w", 0.0) > 0 for s in steady) and all(s.get("c", 0.0) > 0 for s in steady)
    measured = sum(s.get("w", 0.0) + s.get("c", 0.0) for s in steady)
    assert measured / sum(s["d"] for s in steady) > 0.8
    pipelines = [e for e in r["events"] if e["kind"] == "tfdata_pipeline"]
    assert pipelines and pipelines[0]["data"]["serial_maps"] == 1
    # CheckpointManager.save every 20 steps is the checkpoint phase, out of the steps.
    assert len([s for s in r["steps"] if s.get("ph") == "checkpoint"]) == 4
    assert (tmp_path / "ckpt" / "checkpoint").is_file()


@pytest.mark.parametrize(
    "mode", ["function-iter", pytest.param("function-step", marks=pytest.mark.slow)]
)
def test_a_custom_loop_whose_step_is_a_tf_function(tmp_path: Path, mode: str) -> None:
    # function-iter takes its batch inside the compiled step (next(iterator) traced into
    # it); function-step iterates eagerly and calls the step on each batch, and after
    # each epoch calls a tf.function that only predicts: no training step.
    # The eager loop's serial map does twice the usual work per sample: with 60 matrix
    # products its wait was 0.146-0.25 of the step from run to run, around the input
    # rule's 20 % warning (one CI run got no input finding at all).
    rounds = "120" if mode == "function-step" else "60"
    r = _run(tmp_path, mode, "--steps", "60", "--epochs", "2", "--map-rounds", rounds)
    assert r["rc"] == 0 and "done" in r["output"]
    train = [s for s in r["steps"] if s.get("ph", "train") == "train"]
    assert len(train) == 120, len(train)
    steady = train[5:]
    wait = sum(s.get("w", 0.0) for s in steady) / sum(s["d"] for s in steady)
    compute = sum(s.get("c", 0.0) for s in steady) / sum(s["d"] for s in steady)
    # The serial map's wait is measured (in the graph for function-iter), and the call's
    # compute is the rest of the step.
    assert wait > 0.2 and compute > 0.05, (wait, compute)
    (f,) = _input(r["findings"])
    assert f["id"] == "input.workers" and "num_parallel_calls" in f["fix"], f


@pytest.mark.slow
def test_validation_and_checkpoints_are_phases_out_of_the_train_steps(tmp_path: Path) -> None:
    r = _run(tmp_path, "validate", "--steps", "40", "--epochs", "2")
    phases = Counter(s.get("ph", "train") for s in r["steps"])
    assert phases == {"train": 80, "eval": 2, "checkpoint": 2}, phases
    assert (tmp_path / "model.keras").is_file()


@pytest.mark.slow
def test_a_hang_in_a_callback_is_caught_and_the_job_resumes_from_its_backup(
    tmp_path: Path,
) -> None:
    r = _run(tmp_path, "hang-callback", "--steps", "40", "--epochs", "3",
             options=("--timeout-floor", "2", "--unclear-timeout", "2", "--max-restarts", "2",
                      "--grace", "2"))  # fmt: skip
    assert r["rc"] == 0 and r["output"].count("stuck") == 1 and "done" in r["output"]
    ids = [f["id"] for f in r["findings"]]
    # What this test is about comes first; the input rule may add a judgment of the
    # 0.9 ms steps in between (a 20-23 % wait for the prefetched slices was seen 1 run
    # in 20; whether so small a wait should warn is its own question).
    assert ids[0] == "failure.hang" and "restart.summary" in ids, ids
    assert not [i for i in ids if i.startswith(("failure.", "restart.")) and i not in
                ("failure.hang", "restart.summary")], ids  # fmt: skip
    hang = r["findings"][0]
    assert "on_epoch_begin" in hang["title"] and "train_keras.py" in hang["title"]
    # Epoch 1 of 3 done before the hang; BackupAndRestore resumes at epoch 2 (not 1).
    train = [s for s in r["steps"] if s.get("ph", "train") == "train"]
    assert len(train) == 40 + 2 * 40, len(train)


@pytest.mark.slow
def test_a_mirrored_strategy_job_on_two_cpu_devices(tmp_path: Path) -> None:
    r = _run(tmp_path, "mirrored", "--steps", "60")
    assert r["rc"] == 0 and "done" in r["output"]
    assert len([s for s in r["steps"] if s.get("ph", "train") == "train"]) == 60
    assert not [e for e in r["events"] if e["kind"] == "probe_error"], r["events"]
