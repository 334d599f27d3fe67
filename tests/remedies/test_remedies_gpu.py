"""The remedies on a real GPU: a real CUDA out-of-memory error split into micro-batches, the
batch-size finder's CUDA peaks, fp16 with a GradScaler, and the torch switches applied.

The memory tests are sized from the memory they may use (``usable_bytes``): what is free
once the earlier tests' cached blocks are released, and at most ``USABLE_BYTES``, the rest
held by a ballast tensor. So "too large" is too large on any GPU, the out-of-memory error
is the driver's own (a failed ``cudaMalloc``, not a limit of torch's), and each test takes
seconds on a 141 GB GPU too.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
# Without a usable GPU, tests/conftest.py skips these (or fails them under gpu-check).

from torch import nn  # noqa: E402

from trainmedic.probe.apply import Applier  # noqa: E402
from trainmedic.record.types import RunEvent  # noqa: E402
from trainmedic.remedies import (  # noqa: E402
    MicroBatchStep,
    check_mixed_precision,
    find_batch_size,
)

USABLE_BYTES = 6 << 30  # the most GPU memory a test is sized from
BALLAST_MIN_BYTES = 1 << 30  # less spare than this is left free
WIDTH = 4096
BYTES_PER_ROW = WIDTH * 4 * 3  # three activations of WIDTH floats per sample


def release_cached_memory() -> None:
    """Return to the driver what torch's allocator keeps cached (earlier tests' blocks)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.fixture
def usable_bytes() -> Iterator[int]:
    """GPU memory the test can use, in bytes: the rest is held until the test ends."""
    release_cached_memory()
    free, _ = torch.cuda.mem_get_info()
    ballast = None
    if free - USABLE_BYTES >= BALLAST_MIN_BYTES:
        try:
            ballast = torch.empty(free - USABLE_BYTES, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:  # not in one piece: sized from all that is free
            release_cached_memory()
        else:
            torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
    try:
        yield free
    finally:
        del ballast
        release_cached_memory()


def oversized_batch(usable: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """A model and a batch whose activations need about 3x the usable GPU memory."""
    n = max(64, 3 * usable // BYTES_PER_ROW)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)).cuda()
    x = torch.randn(n, 64, device="cuda")
    y = torch.randint(0, 10, (n,), device="cuda")
    return model, x, y, n


def test_a_real_cuda_out_of_memory_completes_through_micro_batches(usable_bytes: int) -> None:
    model, x, y, n = oversized_batch(usable_bytes)
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


def test_fp16_with_a_grad_scaler_splits_too(usable_bytes: int) -> None:
    model, x, y, n = oversized_batch(usable_bytes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")

    def loss_fn(b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.float16):
            return nn.functional.cross_entropy(model(b[0]), b[1])

    step = MicroBatchStep(loss_fn, opt, model=model, scaler=scaler, environ={})
    loss = step((x, y))
    assert torch.isfinite(loss)
    assert step.history[0].ok is False
    assert step.micro_batch_size is not None and step.micro_batch_size < n


def test_the_batch_size_finder_finds_a_limit_and_reports_cuda_peaks(usable_bytes: int) -> None:
    model = nn.Sequential(nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)).cuda()
    limit = usable_bytes // BYTES_PER_ROW
    result = find_batch_size(
        model, lambda k: torch.randn(k, 64, device="cuda"), max_size=4 * limit, repeats=1
    )
    assert result.first_failure is not None
    assert result.largest_fit < result.first_failure <= 4 * limit
    assert all(t.peak_bytes for t in result.trials if t.fits)
    # The peaks grow with the size: the largest fit held at least one more activation
    # of WIDTH floats per sample than the smallest (the ballast is in both).
    fits = sorted((t for t in result.trials if t.fits), key=lambda t: t.size)
    small, large = fits[0], fits[-1]
    assert large.peak_bytes is not None and small.peak_bytes is not None
    assert large.peak_bytes - small.peak_bytes >= (large.size - small.size) * WIDTH * 4


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
