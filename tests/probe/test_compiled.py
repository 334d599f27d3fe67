"""The probe under ``torch.compile``, in this process: a compiled training step keeps the
graph breaks it has without the probe, computes the same, and its steps are still steps.

A whole ``train_step`` is compiled, ``optimizer.step()`` included: dynamo breaks its
graph at ``backward()`` (and inside torch's own optimizer step), never at a hook of the
probe. Compiled training on a GPU (CUDA graph trees) is in ``test_probe_cuda.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from trainmedic.probe import graphs, torch_hooks  # noqa: E402
from trainmedic.probe.env import ProbeConfig  # noqa: E402
from trainmedic.probe.hookutil import run_while_tracing  # noqa: E402
from trainmedic.probe.runtime import Probe  # noqa: E402
from trainmedic.probe.steps import StepDraft  # noqa: E402

STEPS = 6


class Installed:
    """A probe installed into this process's torch, its events and steps kept in lists."""

    def __init__(self) -> None:
        self.probe = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()))
        self.events: list[Any] = []
        self.drafts: list[StepDraft] = []
        self.probe.emit = self.events.append  # type: ignore[method-assign,assignment]
        self.probe._on_draft = self.drafts.append  # type: ignore[method-assign,assignment]
        self.probe._install_torch(torch)

    def errors(self) -> list[Any]:
        return [e for e in self.events if getattr(e, "kind", None) == "probe_error"]


@pytest.fixture(autouse=True)
def forget_compilations() -> Iterator[None]:
    """Dynamo's caches and counters, as empty as before: the detail switch keeps the
    hooks on for good in a process where dynamo has traced anything."""
    yield
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


@pytest.fixture
def installed() -> Iterator[Installed]:
    got = Installed()
    yield got
    torch_hooks.uninstall(got.probe)


def make_train_step() -> Callable[[Any, Any], Any]:
    """A fresh model and optimizer, and a training step using them (not compiled yet)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train_step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return train_step


def batches() -> list[tuple[Any, Any]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 8, generator=gen), torch.randint(0, 4, (16,), generator=gen))
        for _ in range(STEPS)
    ]


def compiled_run(backend: str, eager_steps: int = 0) -> tuple[list[float], Counter[str]]:
    """Losses of ``eager_steps`` eager then compiled training steps, and dynamo's graph breaks."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    train_step = make_train_step()
    compiled = torch.compile(train_step, backend=backend)
    losses = []
    for i, (x, y) in enumerate(batches()):
        step = train_step if i < eager_steps else compiled
        losses.append(step(x, y).item())
    return losses, Counter(counters["graph_break"])


@pytest.mark.parametrize(
    "backend", ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_a_compiled_step_with_its_optimizer_keeps_its_graphs_and_is_a_step_per_call(
    backend: str,
) -> None:
    plain_losses, plain_breaks = compiled_run(backend)
    got = Installed()
    try:
        losses, breaks = compiled_run(backend)
    finally:
        torch_hooks.uninstall(got.probe)
    assert breaks == plain_breaks  # the probe's hooks broke no graph
    assert losses == plain_losses
    # The first call's step ends while dynamo traces its optimizer step; the compiled
    # steps after it, which run no optimizer hook, end at their backward calls.
    assert [(d.step, d.source) for d in got.drafts] == [
        (1, "optimizer"),
        *((n, "backward") for n in range(2, STEPS + 1)),
    ]
    assert all(d.compute_s is not None and d.compute_s > 0 for d in got.drafts)
    assert got.errors() == []


def test_eager_steps_then_compiled_ones_are_one_step_per_call(installed: Installed) -> None:
    _, breaks = compiled_run("eager", eager_steps=3)
    assert [(d.step, d.source) for d in installed.drafts] == [
        *((n, "optimizer") for n in range(1, 5)),
        *((n, "backward") for n in range(5, STEPS + 1)),
    ]
    assert not [reason for reason in breaks if "get_ident" in reason or "perf_counter" in reason]
    assert installed.errors() == []


def test_the_optimizers_device_is_told_while_its_step_is_traced(
    installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device hook (CUDA builds only) runs no hook in compiled code either."""
    _, without_it = compiled_run("eager")
    cuda_device = SimpleNamespace(type="cuda")
    monkeypatch.setattr(graphs, "_first_param_device", lambda optimizer: cuda_device)
    seen: list[Any] = []
    installed.probe.cuda = SimpleNamespace(use_device=seen.append)
    graphs.install_device_hook(torch, installed.probe, installed.probe._ensure_tracker())
    _, breaks = compiled_run("eager")
    assert seen and set(map(id, seen)) == {id(cuda_device)}  # no eager step told it
    assert breaks == without_it


def test_run_while_tracing_marks_functions_as_dynamo_itself_does() -> None:
    """The mark is dynamo's ``assume_constant_result``, set without importing dynamo."""
    import torch._dynamo

    def by_dynamo() -> None:
        pass

    torch._dynamo.assume_constant_result(by_dynamo)
    assert vars(run_while_tracing(lambda: None)) == vars(by_dynamo)
