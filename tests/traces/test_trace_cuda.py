"""A torch.profiler trace recorded on a real GPU, then judged: ``.item()`` every step and
pageable host-to-device copies are both named, the sync at its call site.

Run by scripts/gpu-check; skipped without a GPU (tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


def train_step(model: Any, batch: Any, opt: Any) -> float:
    """An ordinary step that reads its loss back every step, and copies a batch built in
    pageable host memory."""
    x = batch.to("cuda")  # pageable -> device: staged by the driver, synchronous
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())  # the host waits for the GPU, every step


def record(path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=2, active=4),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        with_stack=True,
    ) as prof:
        for _ in range(7):
            batch = torch.randn(8192, 1024)  # 32 MiB on the host, not pinned
            train_step(model, batch, opt)
            prof.step()


def test_item_every_step_and_pageable_copies_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainmedic.cli.main import main
    from trainmedic.traces.kineto import read_trace

    trace = tmp_path / "cuda.json"
    record(trace)
    summary = read_trace(trace)
    assert len(summary.steps) == 4 and summary.device is not None and summary.with_stack
    assert all(s.syncs >= 1 and s.pageable_copies >= 1 for s in summary.steps), summary.steps
    assert main(["report", str(trace), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    found = {f["id"]: f for f in doc["findings"]}
    assert {"gpu.host_sync", "gpu.pageable_copies"} <= set(found), list(found)
    sites = found["gpu.host_sync"]["evidence"]["sync_sites"]
    assert any("train_step" in (s["where"] or "") and s["call"] in ("Tensor.item", "aten::item")
               for s in sites), sites  # fmt: skip
    assert doc["context"]["gpu"]["name"]
