"""Findings whose fix is a remedy name the exact command or call."""

from __future__ import annotations

from diagnose.canonical import CANONICAL
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.memory import FIX as MEMORY_FIX
from trainmedic.resilience.classify import FailureClass
from trainmedic.resilience.classify.findings import FIXES


def first(name: str, prefix: str) -> str:
    return next(f.fix for f in diagnose_run(CANONICAL[name]()) if f.id.startswith(prefix))


def test_input_bound_findings_name_the_tuner_and_apply_from() -> None:
    fix = first("input_no_workers", "input.")
    assert "trainmedic tune dataloader MODULE:FACTORY" in fix
    assert "trainmedic run --apply-from RUN_DIR -- CMD" in fix


def test_slow_storage_names_the_local_cache() -> None:
    assert "trainmedic.LocalCache(local_dir, max_bytes)" in first("input_slow_storage", "input.")


def test_full_precision_names_the_mixed_precision_check() -> None:
    assert "trainmedic.check_mixed_precision(model, batch, loss_fn)" in first(
        "hot_shared_gpu", "model.no_mixed_precision"
    )


def test_memory_findings_and_oom_failures_name_micro_batching() -> None:
    for fix in (MEMORY_FIX, FIXES[FailureClass.CUDA_OOM]):
        assert "trainmedic.MicroBatchStep(loss_fn, optimizer)" in fix
        assert "trainmedic tune batch-size MODULE:FACTORY" in fix


def test_dataloader_worker_deaths_name_the_resilient_dataset() -> None:
    assert "trainmedic.ResilientDataset(dataset)" in FIXES[FailureClass.DATALOADER_WORKER_DIED]
