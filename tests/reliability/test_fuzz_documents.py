"""Fuzzing every document trainmedic reads from a user: one line or success, never a traceback.

Simulation files, run records, findings documents, checkpoint manifests,
error files and the probe channel's lines are each mutated from a valid
seed (:mod:`.fuzzing`) and read the way the user's command reads them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainmedic.channel.wire import decode_line
from trainmedic.errors import CheckpointError
from trainmedic.findings.model import FindingsDocument
from trainmedic.resilience.errorfile import read_error_file
from trainmedic.supervise.loop.resume import newest_checkpointer_checkpoint

from .fuzzing import DEEP, FUZZ, JSON_VALUES, assert_clean, mutated, run_cli

ROOT = Path(__file__).resolve().parents[2]
SIMULATIONS = sorted((ROOT / "examples" / "simulations").glob("*.json"))
SEED_SIMULATIONS = [json.loads(p.read_text()) for p in SIMULATIONS]

# A job with steps, a checkpoint phase, GPU readings (simulated) and host samples.
STEPPER = textwrap.dedent(
    """
    import contextlib, time, trainmedic
    for i in range(50):
        with trainmedic.phase("checkpoint") if i == 25 else contextlib.nullcontext():
            time.sleep(0.03)
        trainmedic.step()
    """
)


def scratch(base: Path) -> Path:
    """A fresh directory per example (hypothesis reuses the test's tmp_path)."""
    return Path(tempfile.mkdtemp(dir=base))


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's directory: meta, steps, GPU and host samples, events, findings."""
    run_dir = tmp_path_factory.mktemp("seed") / "run"
    simulation = ROOT / "examples" / "simulations" / "thermal-throttling.json"
    got = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "-q", "--no-html", "--simulate",
         str(simulation), "--out", str(run_dir), "--", sys.executable, "-c", STEPPER],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert (run_dir / "steps.jsonl").read_text().count("\n") >= 40
    return run_dir


def record_lines(run_dir: Path) -> list[tuple[str, int]]:
    """(file, line index) of every record line in the seed."""
    out = []
    for path in sorted(run_dir.glob("*.jsonl")):
        out += [(path.name, i) for i in range(len(path.read_text().splitlines()))]
    return out


# --- simulation files --------------------------------------------------------------------------


@FUZZ
@given(doc=st.sampled_from(SEED_SIMULATIONS).flatmap(mutated))
def test_fuzz_simulation_files_through_doctor(tmp_path: Path, doc: Any) -> None:
    path = scratch(tmp_path) / "sim.json"
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(["doctor", "--simulate", str(path), "--fail-on", "never"])
    assert_clean(code, err)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), DEEP.map(str.encode)))
def test_fuzz_simulation_bytes(tmp_path: Path, raw: bytes) -> None:
    path = scratch(tmp_path) / "sim.json"
    path.write_bytes(raw)
    code, _, err = run_cli(["doctor", "--simulate", str(path)])
    assert_clean(code, err, ok=())


# --- run records ------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_fuzz_run_records_through_report(tmp_path: Path, seed_run: Path, data: Any) -> None:
    run_dir = scratch(tmp_path) / "run"
    shutil.copytree(seed_run, run_dir)
    (run_dir / "findings.json").unlink()  # diagnose the mutated record again
    target = data.draw(st.sampled_from(["meta.json", *record_lines(seed_run)]))
    if target == "meta.json":
        meta = json.loads((run_dir / "meta.json").read_text())
        (run_dir / "meta.json").write_text(json.dumps(data.draw(mutated(meta))))
    else:
        name, index = target
        lines = (run_dir / name).read_text().splitlines()
        how = data.draw(st.sampled_from(["mutate", "bytes", "deep"]))
        if how == "mutate":
            lines[index] = json.dumps(data.draw(mutated(json.loads(lines[index]))))
        elif how == "bytes":
            raw = data.draw(st.binary(max_size=60)).decode("latin-1")
            lines[index] = raw.replace("\n", "")
        else:
            lines[index] = data.draw(DEEP)
        (run_dir / name).write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(["report", str(run_dir)])
    assert_clean(code, err)


# --- findings documents -----------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_fuzz_findings_documents_through_report(
    tmp_path: Path, seed_run: Path, data: Any
) -> None:
    run_dir = scratch(tmp_path) / "run"
    shutil.copytree(seed_run, run_dir)
    seed = json.loads((seed_run / "findings.json").read_text())
    doc = data.draw(st.one_of(mutated(seed), JSON_VALUES))
    (run_dir / "findings.json").write_text(json.dumps(doc))
    out = scratch(tmp_path)
    code, _, err = run_cli(
        ["report", str(run_dir), "--json", str(out / "f.json"), "--html", str(out / "r.html")]
    )
    assert_clean(code, err)
    if code == 0:  # what it accepted, it wrote as a valid document
        FindingsDocument.from_dict(json.loads((out / "f.json").read_text()))


# --- checkpoint manifests ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from trainmedic.checkpoint import Checkpointer

    directory = tmp_path_factory.mktemp("ckpt")
    Checkpointer(directory).save(7)
    return directory


@FUZZ
@given(data=st.data())
def test_fuzz_checkpoint_manifests(tmp_path: Path, seed_checkpoint: Path, data: Any) -> None:
    from trainmedic.checkpoint import Checkpointer

    directory = scratch(tmp_path)
    shutil.copytree(seed_checkpoint, directory, dirs_exist_ok=True)
    (manifest,) = directory.glob("*.json")
    how = data.draw(st.sampled_from(["mutate", "any", "deep"]))
    if how == "mutate":
        text = json.dumps(data.draw(mutated(json.loads(manifest.read_text()))))
    elif how == "any":
        text = json.dumps(data.draw(JSON_VALUES))
    else:
        text = data.draw(DEEP)
    manifest.write_text(text)
    point = newest_checkpointer_checkpoint(directory)  # never raises
    assert point is None or point.path.exists()
    try:
        step = Checkpointer(directory).load(rng=False)
    except CheckpointError:
        step = None
    assert step in (None, 7)


# --- error files and the probe channel --------------------------------------------------------

ERROR_FILE = {
    "message": {
        "message": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"},
    },
    "type": "RuntimeError",
    "rank": 0,
    "t": 1700000000.5,
}


@FUZZ
@given(doc=st.one_of(mutated(ERROR_FILE), JSON_VALUES))
def test_fuzz_error_files(tmp_path: Path, doc: Any) -> None:
    path = scratch(tmp_path) / "error-123.json"
    path.write_text(json.dumps(doc))
    try:
        report = read_error_file(path)
    except ValueError:
        return
    assert isinstance(report.message, str)


HELLO = {"k": "hello", "pid": 1, "ppid": 0, "role": "process", "argv": ["t.py"], "t": 1.0}
STEP = {"k": "step", "step": 3, "t": 2.0, "d": 0.1, "dw": 0.01, "pid": 1}


LINES = st.one_of(
    st.binary(max_size=80),
    mutated(HELLO).map(json.dumps).map(str.encode),
    mutated(STEP).map(json.dumps).map(str.encode),
    DEEP.map(str.encode),
)


@FUZZ
@given(line=LINES)
def test_fuzz_channel_lines(line: bytes) -> None:
    # A message, or one of the three errors the channel server turns into a dropped line.
    with contextlib.suppress(ValueError, KeyError, TypeError):
        decode_line(line)
