"""The remedies on a real GPU: a real CUDA out-of-memory error split into micro-batches, the
batch-size finder's CUDA peaks, fp16 with a GradScaler, and the torch switches applied."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - a GPU machine always has it
    pytest.skip("no CUDA device", allow_module_level=True)

from torch import nn  # noqa: E402

from trainmedic.probe.apply import Applier  # noqa: E402
from trainmedic.record.types import RunEvent  # noqa: E402
from trainmedic.remedies import (  # noqa: E402
    MicroBatchStep,
    check_mixed_precision,
    find_batch_size,
)


def oversized_batch() -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """A model and a batch whose activations need about 3x the free GPU memory."""
    free, _ = torch.cuda.mem_get_info()
    width = 4096
    n = max(64, int(3 * free // (width * 4 * 3)))  # three activations of n x width floats
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10)).cuda()
    x = torch.randn(n, 64, device="cuda")
    y = torch.randint(0, 10, (n,), device="cuda")
    return model, x, y, n


def test_a_real_cuda_out_of_memory_completes_through_micro_batches() -> None:
    model, x, y, n = oversized_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    step = MicroBatchStep(
        lambda b: nn.functional.cross_entropy(model(b[0]), b[1]), opt, model=model, environ={}
    )
    step((x, y))
    assert step.history[0].ok is False and step.history[-1].ok is True
    micro = step.micro_batch_size
    assert micro is not None and micro < n
    got = [p.grad.clone() for p in model.parameters()]
    opt.zero_grad()
    for start in range(0, n, micro):  # the same accumulation by hand
        xb, yb = x[start : start + micro], y[start : start + micro]
        (nn.functional.cross_entropy(model(xb), yb) * len(xb) / n).backward()
    for a, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def test_fp16_with_a_grad_scaler_splits_too() -> None:
    model, x, y, _ = oversized_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")

    def loss_fn(b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.float16):
            return nn.functional.cross_entropy(model(b[0]), b[1])

    step = MicroBatchStep(loss_fn, opt, model=model, scaler=scaler, environ={})
    loss = step((x, y))
    assert torch.isfinite(loss) and step.micro_batch_size is not None


def test_the_batch_size_finder_finds_a_limit_and_reports_cuda_peaks() -> None:
    free, _ = torch.cuda.mem_get_info()
    width = 4096
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10)).cuda()
    limit = int(free // (width * 4 * 3))
    result = find_batch_size(
        model, lambda k: torch.randn(k, 64, device="cuda"), max_size=4 * limit, repeats=1
    )
    assert result.first_failure is not None
    assert result.largest_fit < result.first_failure <= 4 * limit
    assert all(t.peak_bytes for t in result.trials if t.fits)


def test_the_mixed_precision_check_runs_fp16_and_bf16_where_supported() -> None:
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).cuda()
    batch = (torch.randn(256, 512, device="cuda"), torch.randint(0, 10, (256,), device="cuda"))
    report = check_mixed_precision(
        model, batch, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])
    )
    assert report.supported["float16"] is True
    assert {t.dtype for t in report.trials} >= {"float16"}
    assert all(t.error is None and t.peak_bytes for t in report.trials)


class Probe:
    def __init__(self) -> None:
        self.role = "process"
        self.events: list[RunEvent] = []
        self.restore: list[Any] = []
        self.state = SimpleNamespace(training_ident=threading.get_ident())

    def _event(self, kind: str, message: str, data: dict[str, Any]) -> RunEvent:
        return RunEvent(0.0, kind, message, data=data)

    def emit(self, event: RunEvent) -> None:
        self.events.append(event)


def test_tf32_is_applied_on_a_cuda_build() -> None:
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    probe = Probe()
    try:
        applier = Applier(torch, probe, {"switches": {"tf32_matmul": True}})  # type: ignore[arg-type]
        applier.install()
        assert torch.get_float32_matmul_precision() == "high"
        applier.report_switches()
        assert [e.kind for e in probe.events] == ["remedy_applied"]
    finally:
        torch.set_float32_matmul_precision(precision)
        while probe.restore:
            probe.restore.pop()()
