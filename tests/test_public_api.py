"""The public surface of the package is deliberate: pin it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import trainmedic


def test_version_is_exported() -> None:
    assert trainmedic.__version__.count(".") == 2


def test_import_does_not_import_torch() -> None:
    # `import trainmedic` runs inside every training process (the probe) and in
    # every CLI call: it must stay cheap, so it must never pull in torch.
    code = "import sys, trainmedic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_public_name_resolves() -> None:
    import trainmedic.remedies

    for name in trainmedic.__all__:
        assert getattr(trainmedic, name) is not None, name
    for name in trainmedic.remedies.__all__:
        assert getattr(trainmedic.remedies, name) is not None, name
    assert trainmedic.MicroBatchStep is trainmedic.remedies.MicroBatchStep


def test_importing_the_remedies_does_not_import_torch() -> None:
    # The remedies run inside the job, which has torch; importing them costs nothing
    # until one is used.
    code = (
        "import sys, trainmedic.remedies, trainmedic.remedies.apply.plan; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_public_names_are_pinned() -> None:
    """Adding or removing a public name is a decision: this list changes with it."""
    assert sorted(trainmedic.__all__) == sorted(
        [
            "CachedDataset", "CheckpointError", "Checkpointer", "InputError", "LocalCache",
            "MicroBatchError", "MicroBatchStep", "ResilientDataset", "RunDirectoryError",
            "SimulationFileError", "ThreadedFetch", "TooManyBadSamples", "TrainmedicError",
            "UsageError", "__version__", "check_mixed_precision", "find_batch_size",
            "max_num_workers", "micro_batch_divisor", "micro_batch_plan", "phase", "remedy",
            "step", "tune_dataloader",
        ]
    )  # fmt: skip


def test_every_error_a_script_may_catch_is_a_trainmedic_error() -> None:
    errors = [n for n in trainmedic.__all__ if n.endswith("Error") or n == "TooManyBadSamples"]
    assert len(errors) == 8
    for name in errors:
        assert issubclass(getattr(trainmedic, name), trainmedic.TrainmedicError), name
    assert issubclass(trainmedic.RunDirectoryError, trainmedic.InputError)
    assert issubclass(trainmedic.InputError, trainmedic.UsageError)


def test_diagnose_reads_a_run_directory(tmp_path: Path) -> None:
    from support.builders import make_record, make_steps
    from trainmedic.diagnose import diagnose, diagnose_run
    from trainmedic.record.store import RunRecordWriter

    record = make_record(make_steps(200, duration=0.1, wait=0.06))
    with RunRecordWriter(tmp_path / "run") as w:
        w.write_meta(record.meta)
        for s in record.steps:
            w.add_step(s)
    findings = diagnose(str(tmp_path / "run"))
    # What was written is what is judged: the same findings as the record in memory.
    assert [f.id for f in findings] == [f.id for f in diagnose_run(record)]
    assert findings[0].id == "host.unexplained"  # waits between steps, no loader seen
    assert findings[0].impact == pytest.approx(0.6, abs=0.01)


def test_diagnose_of_a_missing_directory_is_a_run_directory_error(tmp_path: Path) -> None:
    from trainmedic.diagnose import diagnose

    with pytest.raises(trainmedic.RunDirectoryError):
        diagnose(tmp_path / "nothing-here")
