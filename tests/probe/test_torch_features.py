"""The probe on a torch that lacks an API it hooks: what it still measures, and saying so.

Only recent torch releases install here, so older ones are made by removing
the attributes the probe looks for (a torch before 2.0 has no global optimizer
step hooks, for one).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from trainmedic.probe import torch_features, torch_hooks  # noqa: E402
from trainmedic.probe.env import ProbeConfig  # noqa: E402
from trainmedic.probe.runtime import Probe  # noqa: E402
from trainmedic.probe.steps import StepDraft  # noqa: E402


class Installed:
    """A probe installed into this process's torch, its events and steps kept in lists."""

    def __init__(self) -> None:
        self.probe = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()))
        self.events: list[Any] = []
        self.drafts: list[StepDraft] = []
        self.probe.emit = self.events.append  # type: ignore[method-assign]
        self.probe._on_draft = self.drafts.append  # type: ignore[method-assign]

    def degraded(self) -> list[Any]:
        return [e for e in self.events if getattr(e, "kind", None) == "probe_degraded"]


@pytest.fixture
def installed() -> Iterator[Installed]:
    got = Installed()
    yield got
    torch_hooks.uninstall(got.probe)


def train(steps: int, loader: bool = False) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8 * steps, 4))
    batches = (
        iter(torch.utils.data.DataLoader(data, batch_size=8))
        if loader
        else iter([(torch.randn(8, 4),) for _ in range(steps)])
    )
    for _ in range(steps):
        (x,) = next(batches)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def test_this_torch_lacks_nothing() -> None:
    assert torch_features.find_gaps(torch) == []
    assert not torch_features.too_old(torch.__version__)


@pytest.mark.parametrize(
    ("version", "old"),
    [("1.13.1+cu117", True), ("2.0.0", False), ("2.13.0+cpu", False), ("nightly", False)],
)
def test_versions_older_than_the_supported_range(version: str, old: bool) -> None:
    assert torch_features.too_old(version) is old


def test_without_global_optimizer_hooks_steps_end_at_backward_calls(
    installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    optimizer_mod = importlib.import_module("torch.optim.optimizer")
    monkeypatch.delattr(optimizer_mod, "register_optimizer_step_pre_hook")
    installed.probe._install_torch(torch)
    (event,) = installed.degraded()
    assert [m["feature"] for m in event.data["missing"]] == ["optimizer_step_hooks"]
    assert event.data["missing"][0]["since"] == "2.0"
    assert event.data["parts_off"] == []  # steps are still measured, another way
    assert "register_optimizer_step_pre_hook" in event.message
    assert installed.probe.parts["steps"].on
    train(40)
    # The tracker holds backward segments until it is sure no optimizer step comes.
    installed.probe.tracker.finish(installed.probe.clock())  # type: ignore[union-attr]
    sources = {d.source for d in installed.drafts}
    assert sources == {"backward"}
    assert len(installed.drafts) == 40
    assert not [e for e in installed.events if getattr(e, "kind", None) == "probe_error"]


def test_without_the_loader_iterator_the_loader_part_is_off_and_steps_go_on(
    installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(torch.utils.data.dataloader, "_BaseDataLoaderIter")
    original_iter = torch.utils.data.DataLoader.__iter__
    installed.probe._install_torch(torch)
    (event,) = installed.degraded()
    assert event.data["parts_off"] == ["loader"]
    assert not installed.probe.parts["loader"].on
    assert "_BaseDataLoaderIter" in (installed.probe.parts["loader"].error or "")
    assert torch.utils.data.DataLoader.__iter__ is original_iter  # nothing hooked there
    monkeypatch.undo()  # the job's DataLoader itself works as ever
    train(5, loader=True)
    assert [d.source for d in installed.drafts] == ["optimizer"] * 5
    assert all(d.loader_fetches == 0 for d in installed.drafts)


def test_without_the_module_call_the_forward_part_is_off(
    installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = SimpleNamespace(
        nn=SimpleNamespace(Module=type("Module", (), {})),
        autograd=torch.autograd,
        utils=torch.utils,
        version=SimpleNamespace(cuda=None),
    )
    gaps = torch_features.find_gaps(fake)
    assert [g.feature for g in gaps] == ["module_call"]
    off = torch_features.switch_off(gaps, installed.probe.parts, "1.9.0")
    assert off == ["forward"] and not installed.probe.parts["forward"].on
    message, data = torch_features.degraded_event_data("1.9.0", gaps, off)
    assert data["older_than_supported"] is True
    assert "supports torch 2.0+" in message


def test_a_cuda_build_without_capture_queries_times_no_gpu_step() -> None:
    cuda = SimpleNamespace(
        Event=object,
        is_initialized=lambda: False,
        current_stream=lambda device=None: None,
        CUDAGraph=type("G", (), {"capture_begin": 0, "capture_end": 0, "replay": 0}),
    )  # no is_current_stream_capturing: recording an event could break a capture
    fake = SimpleNamespace(
        nn=torch.nn,
        autograd=torch.autograd,
        utils=torch.utils,
        cuda=cuda,
        version=SimpleNamespace(cuda="11.8"),
    )
    (gap,) = torch_features.find_gaps(fake)
    assert (gap.feature, gap.part, gap.whole_part) == ("cuda_events", "cuda", True)
    assert gap.api == "torch.cuda.is_current_stream_capturing"


def test_the_degradation_becomes_a_finding(tmp_path: Any) -> None:
    from trainmedic.diagnose.probe_coverage import probe_degraded
    from trainmedic.record.types import RunEvent

    message, data = torch_features.degraded_event_data(
        "1.13.1",
        [g for g in torch_features.find_gaps(SimpleNamespace()) if g.part == "loader"],
        ["loader"],
    )
    events = [RunEvent(1.0, "probe_degraded", message, pid=pid, data=data) for pid in (11, 12)]
    (finding,) = probe_degraded(events)
    assert finding.id == "probe.degraded"
    assert finding.evidence["processes"] == [11, 12]
    assert finding.evidence["parts_off"] == ["loader"]
    assert finding.title == (
        "The probe measured less with torch 1.13.1 (older than 2.0, the oldest supported "
        "release): 1 API(s) it hooks are missing, probe parts off: loader"
    )
    assert finding.detail is not None and "DataLoader batches" in finding.detail
    assert "2.0" in finding.fix


def test_a_run_on_an_old_torch_says_what_the_probe_could_not_measure(tmp_path: Any) -> None:
    """A whole ``trainmedic run`` whose job imports a torch without the hooked APIs
    (a stand-in package): the job runs, and findings.json names what was missing."""
    import json
    import subprocess
    import sys

    fake = tmp_path / "old" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        '__version__ = "1.13.1"\n\nclass version:\n    cuda = None\n'
    )
    job = tmp_path / "job.py"
    job.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(fake.parent)!r})\n"
        "import time\nimport torch\nimport trainmedic\n"
        "for _ in range(30):\n    time.sleep(0.002)\n    trainmedic.step()\n"
        "print('done', torch.__version__)\n"
    )
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(out),
         "--", sys.executable, str(job)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "done 1.13.1" in result.stdout
    findings = json.loads((out / "findings.json").read_text())["findings"]
    (degraded,) = [f for f in findings if f["id"] == "probe.degraded"]
    assert degraded["evidence"]["torch"] == ["1.13.1"]
    assert set(degraded["evidence"]["parts_off"]) == {"forward", "backward", "loader"}
    apis = {m["api"] for m in degraded["evidence"]["missing_apis"]}
    assert "torch.optim.optimizer.register_optimizer_step_pre_hook/_post_hook" in apis
    # The steps the script marked itself are all there.
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["src"] for s in steps] == ["api"] * 30
