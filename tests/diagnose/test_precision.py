"""GPU-bound without mixed precision on bf16-capable GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from support.builders import make_gpu, make_gpu_series, make_machine, make_record, make_steps
from trainmedic.diagnose.precision import no_mixed_precision
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Severity
from trainmedic.record.types import RunRecord

TH = Thresholds()


def fp32_record(
    *,
    util: float = 95.0,
    capability: tuple[int, int] | None = (8, 0),
    autocast: bool | None = False,
) -> RunRecord:
    return make_record(
        make_steps(100, 0.2, 0.002, autocast=autocast),
        gpu=make_gpu_series(25, utilization_gpu_pct=util, compute_capability=capability),
    )


def test_fp32_gpu_bound_on_ampere_fires_with_bf16_fix() -> None:
    (f,) = no_mixed_precision(RunView.of(fp32_record()), TH)
    assert f.id == "model.no_mixed_precision" and f.category is Category.MODEL
    assert f.severity is Severity.WARNING
    assert f.impact == pytest.approx(0.4 * 0.95)
    assert 'torch.autocast("cuda", dtype=torch.bfloat16)' in f.fix
    assert f.evidence["compute_capability"] == "8.0"


@pytest.mark.parametrize(
    ("kwargs", "fires"),
    [
        ({"capability": (7, 5)}, False),  # Turing: no bf16 tensor cores
        ({"capability": (8, 6)}, True),
        ({"autocast": True}, False),
        ({"autocast": None}, False),  # unknown is not "off"
        ({"util": 79.0}, False),
        ({"util": 80.0}, True),
    ],
)
def test_edges(kwargs: dict[str, Any], fires: bool) -> None:
    found = no_mixed_precision(RunView.of(fp32_record(**kwargs)), TH)
    assert bool(found) is fires


def test_capability_from_doctor_facts_when_samples_lack_it() -> None:
    record = fp32_record(capability=None)
    assert no_mixed_precision(RunView.of(record), TH) == []
    machine = make_machine(gpus=[make_gpu(compute_capability=(9, 0))])
    assert len(no_mixed_precision(RunView.of(record, machine), TH)) == 1


def test_mostly_autocast_run_is_quiet() -> None:
    steps = make_steps(100, 0.2, autocast=True)
    steps[:20] = make_steps(20, 0.2, autocast=False)  # 20 % off is under the 90 % bar
    record = make_record(steps, gpu=make_gpu_series(25, compute_capability=(9, 0)))
    assert no_mixed_precision(RunView.of(record), TH) == []
