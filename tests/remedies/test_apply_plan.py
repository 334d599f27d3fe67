"""What ``run --apply-from`` plans from a previous run or a tuning file, before the job starts."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from diagnose.canonical import CANONICAL
from support.builders import T0
from trainmedic.errors import InputError
from trainmedic.findings.model import Category, Finding, FindingsDocument, Severity
from trainmedic.record.store import RunRecordWriter
from trainmedic.record.types import RunEvent, RunRecord
from trainmedic.remedies.apply.plan import ApplyPlan, bound_to_machine, plan_from
from trainmedic.remedies.limits import LoaderLimits

BIG = LoaderLimits(usable_cores=64.0, memory_available_bytes=None, shm_free_bytes=None)
"""A machine that bounds none of the settings these tests plan."""


def write_run(record: RunRecord, run_dir: Path, findings: list[Finding] | None = None) -> Path:
    writer = RunRecordWriter(run_dir)
    writer.write_meta(record.meta)
    for step in record.steps:
        writer.add_step(step)
    for gpu in record.gpu:
        writer.add_gpu(gpu)
    for host in record.host:
        writer.add_host(host)
    for loader in record.loaders:
        writer.add_loader(loader)
    for activity in record.loader_activity:
        writer.add_loader_activity(activity)
    for event in record.events:
        writer.add_event(event)
    writer.close()
    if findings is not None:
        doc = FindingsDocument.build("run", findings, created_at=0.0)
        (run_dir / "findings.json").write_text(json.dumps(doc.to_dict()))
    return run_dir


def tuning_file(path: Path, ci: list[float], **best: object) -> Path:
    settings = {"num_workers": 4, "prefetch_factor": 4, "persistent_workers": True,
                "pin_memory": False, "threads": 1}  # fmt: skip
    settings.update(best)
    path.write_text(
        json.dumps(
            {
                "tool": "tune-dataloader",
                "best": settings,
                "speedup": sum(ci) / 2,
                "speedup_ci": ci,
                "dataset_type": "data.Images",
            }
        )
    )
    return path


def test_an_input_bound_run_plans_its_findings_loader_settings(tmp_path: Path) -> None:
    plan = plan_from(write_run(CANONICAL["input_no_workers"](), tmp_path / "run"))
    assert plan.dataloader["num_workers"] >= 2
    assert plan.dataloader["prefetch_factor"] == 4
    assert plan.reasons["num_workers"].startswith("input.")
    assert plan.dataset_types == ("map",)  # the training loader's dataset
    assert "persistent_workers" not in plan.dataloader


def test_findings_json_is_read_when_present_and_info_findings_are_not_applied(
    tmp_path: Path,
) -> None:
    def finding(severity: Severity, workers: int, id_: str) -> Finding:
        return Finding(
            id=id_,
            category=Category.IO,
            severity=severity,
            title="waits",
            apply={"dataloader": {"num_workers": workers, "persistent_workers": True}},
        )

    run = write_run(
        CANONICAL["healthy_cpu"](),
        tmp_path / "run",
        [finding(Severity.WARNING, 3, "input.io"), finding(Severity.INFO, 9, "input.hint")],
    )
    plan = plan_from(run, limits=BIG)
    assert plan.dataloader == {"num_workers": 3}
    assert "not applied" in plan.reasons["persistent_workers"]


def test_a_gpu_bound_float32_run_plans_tf32_and_cudnn_autotuning(tmp_path: Path) -> None:
    plan = plan_from(write_run(CANONICAL["hot_shared_gpu"](), tmp_path / "run"))
    assert plan.switches == {"tf32_matmul": True, "cudnn_benchmark": True}
    assert "model.no_mixed_precision" in plan.reasons["tf32_matmul"]


def test_a_healthy_cpu_run_plans_nothing_and_says_why(tmp_path: Path) -> None:
    plan = plan_from(write_run(CANONICAL["healthy_cpu"](), tmp_path / "run"))
    assert plan.empty
    lines = plan.describe()
    assert any("no finding of the run recommends loader settings" in line for line in lines)
    assert any("did not use a GPU" in line for line in lines)


def test_a_significant_tuning_result_is_applied_and_persistence_is_left_out(
    tmp_path: Path,
) -> None:
    plan = plan_from(tuning_file(tmp_path / "t.json", [1.6, 2.1], threads=8), limits=BIG)
    assert plan.dataloader == {"num_workers": 4, "prefetch_factor": 4, "threads": 8}
    assert plan.dataset_types == ("data.Images",)
    assert "1.85x (95 % CI 1.60x-2.10x)" in plan.reasons["num_workers"]


def test_a_tuning_result_whose_interval_includes_one_applies_nothing(tmp_path: Path) -> None:
    plan = plan_from(tuning_file(tmp_path / "t.json", [0.97, 1.2]))
    assert plan.empty and "significantly faster" in plan.reasons["dataloader"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a JSON file"),
        ('{"tool": "doctor"}', "not a tuning result"),
        ('{"tool": "tune-dataloader"}', "has no 'best' settings"),
    ],
)
def test_bad_tuning_files_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        plan_from(path)


def test_endless_huge_or_deep_tuning_files_are_refused_without_reading_them_whole(
    tmp_path: Path,
) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(1 << 40)  # a sparse TiB: refused from its size, never read
    with pytest.raises(InputError, match=r"not a JSON file.*larger than"):
        plan_from(huge)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=r"not a JSON file.*nest"):
        plan_from(deep)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"tool": "tune-dataloader", "x": "\xff"}')
    with pytest.raises(InputError, match="not UTF-8"):
        plan_from(latin)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00" * 10, "unreadable findings"),
        (b"[1, 2]", "not a findings document"),
        (b'{"findings": [{"id": 3}]}', "not a findings document"),
    ],
)
def test_a_run_whose_findings_are_damaged_is_refused_in_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    run_dir = write_run(CANONICAL["input_no_workers"](), tmp_path / "run")
    (run_dir / "findings.json").write_bytes(content)
    with pytest.raises(InputError, match=message) as err:
        plan_from(run_dir)
    assert "\n" not in str(err.value)


def test_missing_sources_and_directories_that_are_not_runs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such run directory or tuning file"):
        plan_from(tmp_path / "nothing")
    with pytest.raises(InputError, match="not a trainmedic run directory"):
        plan_from(tmp_path)
    with pytest.raises(InputError, match="not a run directory or a regular file"):
        plan_from("/dev/null")


def test_the_plan_travels_as_json() -> None:
    plan = ApplyPlan("src", {"num_workers": 2}, {"tf32_matmul": True}, ("a.B",), {"x": "y"})
    assert ApplyPlan.from_dict(json.loads(plan.to_env())) == plan


def applied_run(tmp_path: Path, *events: RunEvent) -> Path:
    rec = CANONICAL["healthy_cpu"]()
    rec.events.extend(events)
    run = write_run(rec, tmp_path / "run", [])
    doc = json.loads((run / "findings.json").read_text())
    doc["context"]["apply_plan"] = ApplyPlan(
        "first-run", {"num_workers": 2, "prefetch_factor": 4}, {}, ("data.Images",)
    ).to_dict()
    (run / "findings.json").write_text(json.dumps(doc))
    return run


def test_what_the_previous_run_applied_and_kept_is_applied_again(tmp_path: Path) -> None:
    # The script is unmodified: its next run needs the settings again, though the
    # previous run's findings no longer ask for them.
    kept = RunEvent(T0, "remedy_applied", "DataLoader ...", data={"remedy": "dataloader"})
    plan = plan_from(applied_run(tmp_path, kept))
    assert plan.dataloader == {"num_workers": 2, "prefetch_factor": 4}
    assert plan.dataset_types == ("data.Images",)
    assert "with --apply-from, and kept" in plan.reasons["num_workers"]


def test_what_the_previous_run_had_to_revert_is_not_applied_again(tmp_path: Path) -> None:
    applied = RunEvent(T0, "remedy_applied", "DataLoader ...", data={"remedy": "dataloader"})
    reverted = RunEvent(T0, "remedy_reverted", "back", data={"remedy": "dataloader"})
    assert plan_from(applied_run(tmp_path, applied, reverted)).dataloader == {}


# --- values checked, and held to this machine ---------------------------------------------


TWO_CORES = LoaderLimits(usable_cores=2.0, memory_available_bytes=8 << 30, shm_free_bytes=1 << 30)


def test_settings_tuned_on_a_large_node_are_held_to_this_machines_cores(tmp_path: Path) -> None:
    # The kind of file tuned on a 64-core node: 10000 workers would start over a
    # thousand processes here before the first step.
    path = tuning_file(tmp_path / "t.json", [1.5, 2.0], num_workers=10000, prefetch_factor=64,
                       threads=200)  # fmt: skip
    plan = plan_from(path, limits=TWO_CORES)
    assert plan.dataloader["num_workers"] == 2
    assert plan.dataloader["prefetch_factor"] == 16
    assert plan.dataloader["threads"] == 128  # 256 samples in flight over 2 workers
    said = "\n".join(plan.describe())
    assert "num_workers=2 (10000 asked, 2 applied: 2 usable cores on this machine" in said
    assert "64 asked, 16 applied" in said and "200 asked, 128 applied" in said
    # Within bounds, values are applied as given.
    small = plan_from(tuning_file(tmp_path / "s.json", [1.5, 2.0], num_workers=2), TWO_CORES)
    assert small.dataloader["num_workers"] == 2 and "asked" not in small.reasons["num_workers"]


def test_the_open_files_limit_bounds_workers_too() -> None:
    plan = ApplyPlan("x", {"num_workers": 8}, {}, (), {"num_workers": "tuned"})
    many = LoaderLimits(usable_cores=64.0, memory_available_bytes=None, shm_free_bytes=None)
    bounded = bound_to_machine(plan, many, nofile=128)
    assert bounded.dataloader["num_workers"] == 4
    assert bounded.reasons["num_workers"].startswith("8 asked, 4 applied: the job may open 128")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"prefetch_factor": 1e308}, "prefetch_factor must be a whole number from 1 to 65536, "
                                     "not 1e+308"),
        ({"num_workers": "4"}, 'num_workers must be a whole number from 0 to 65536, not "4"'),
        ({"num_workers": -1}, "num_workers must be a whole number from 0 to 65536, not -1"),
        ({"num_workers": 2.5}, "not 2.5"),
        ({"num_workers": True}, "not true"),
        ({"threads": [4]}, "threads must be a whole number from 1 to 65536, not list"),
        ({"pin_memory": "yes"}, 'pin_memory must be true or false, not "yes"'),
    ],
)  # fmt: skip
def test_a_value_no_loader_takes_is_refused_in_one_line(
    tmp_path: Path, value: dict[str, object], message: str
) -> None:
    path = tuning_file(tmp_path / "bad.json", [1.5, 2.0], **value)
    with pytest.raises(InputError) as info:
        plan_from(path, limits=TWO_CORES)
    assert str(info.value).startswith(f"--apply-from {path}: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_whole_float_is_a_whole_number(tmp_path: Path) -> None:
    plan = plan_from(tuning_file(tmp_path / "f.json", [1.5, 2.0], num_workers=2.0), TWO_CORES)
    assert plan.dataloader["num_workers"] == 2 and isinstance(plan.dataloader["num_workers"], int)


def test_run_refuses_a_bad_file_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainmedic.cli.main import main

    monkeypatch.chdir(tmp_path)
    path = tuning_file(tmp_path / "bad.json", [1.5, 2.0], prefetch_factor="lots")
    marker = tmp_path / "ran"
    code = main(["run", "--apply-from", str(path), "--", "touch", str(marker)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "prefetch_factor must be a whole number" in err
    assert not marker.exists() and not (tmp_path / "trainmedic-runs").exists()


def test_a_runs_fixes_are_refused_for_another_script_unless_the_user_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainmedic.cli.main import main

    record = CANONICAL["input_no_workers"]()
    record.meta = dataclasses.replace(record.meta, command=("python", "train_a.py"))
    source = write_run(record, tmp_path / "run")
    assert plan_from(source, limits=BIG).made_for == ("python", "train_a.py")
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    script = tmp_path / "train_b.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    code = main(["run", "--apply-from", str(source), "--", sys.executable, str(script)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "that run was of train_a, this command runs train_b" in err and "--apply-anyway" in err
    assert not marker.exists()
    # The same script by another path or interpreter is the same script.
    same = tmp_path / "elsewhere" / "train_a.py"
    same.parent.mkdir()
    same.write_text(f"open({str(marker)!r}, 'w').close()\n")
    code = main(["run", "--quiet", "--no-html", "--out", str(tmp_path / "r1"), "--apply-from",
                 str(source), "--", sys.executable, str(same)])  # fmt: skip
    assert code == 0 and marker.exists()
    marker.unlink()
    code = main(["run", "--quiet", "--no-html", "--out", str(tmp_path / "r2"), "--apply-from",
                 str(source), "--apply-anyway", "--", sys.executable, str(script)])  # fmt: skip
    assert code == 0 and marker.exists()
    assert main(["run", "--apply-anyway", "--", "true"]) == 2


def test_a_tuning_file_names_the_code_of_its_dataset(tmp_path: Path) -> None:
    path = tuning_file(tmp_path / "t.json", [1.5, 2.0])
    data = json.loads(path.read_text())
    data["dataset_code"] = "ab" * 32
    path.write_text(json.dumps(data))
    plan = plan_from(path, limits=BIG)
    assert plan.dataset_codes == ("ab" * 32,)
    assert ApplyPlan.from_dict(json.loads(plan.to_env())).dataset_codes == ("ab" * 32,)
