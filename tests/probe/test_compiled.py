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


def compilations() -> Counter[str]:
    """Frames dynamo compiled since the last call, by name: a frame compiled again (a guard
    failed) counts once more; a frame dynamo only looked at and skipped does not count."""
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    got = Counter(m.co_name for m in get_compilation_metrics())
    clear_compilation_metrics()
    return got


class HookedNet(torch.nn.Module):
    """A model with a forward hook on an inner layer: dynamo then traces that layer's
    ``__call__`` (whatever ``nn.Module.__call__`` is at the time) instead of going
    straight to its ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
        )
        self.body[0].register_forward_hook(lambda module, args, out: None)

    def forward(self, x: Any) -> Any:
        return self.body(x)


SCHEDULES = {
    # The watch patches the classes seen in the eager steps, then dynamo first compiles...
    "watching": ("end", "compiled", "begin", "compiled", "end", "compiled"),
    # ... or first compiles during a later discovery (the generic wrapper is on).
    "discovering": ("end", "begin", "compiled", "end", "compiled", "begin", "compiled"),
}
"""After two eager steps while discovering: the watch's moves and compiled steps in turn."""


def run_across_discoveries(
    watch: Any | None, schedule: str, compiled_part: str
) -> tuple[list[float], Counter[str]]:
    """Losses of two eager steps, the schedule's compiled steps (two at each ``compiled``)
    and one eager step, and the frames dynamo compiled. ``compiled_part`` is ``function``
    (a compiled function calling the model and the loss) or ``model`` (``torch.compile
    (model)``, made while the watch discovers, called in eager steps). ``begin`` and
    ``end`` are the watch's own (what its safe points do when a discovery is due: the
    routine one every 30 s), swapping ``nn.Module.__call__``; without a watch they are
    left out."""
    torch._dynamo.reset()
    compilations()
    model, loss_fn = HookedNet(), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    compiled_model = torch.compile(model, backend="eager") if compiled_part == "model" else None

    def forward_loss(x: Any, y: Any) -> Any:
        return loss_fn(model(x), y)

    def compiled_model_loss(x: Any, y: Any) -> Any:
        assert compiled_model is not None
        return loss_fn(compiled_model(x), y)

    compiled = (
        torch.compile(forward_loss, backend="eager")
        if compiled_part == "function"
        else compiled_model_loss
    )
    x, y = batches()[0]
    losses = []

    def steps(fn: Callable[[Any, Any], Any], n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            loss = fn(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    steps(forward_loss, 2)
    for move in SCHEDULES[schedule]:
        if move == "compiled":
            steps(compiled, 2)
        elif watch is not None:
            getattr(watch, move)(watch._probe.clock())
    steps(forward_loss, 1)
    return losses, compilations()


@pytest.mark.parametrize(
    ("schedule", "compiled_part"),
    [("watching", "function"), ("discovering", "function"), ("watching", "model")],
)
def test_compiled_code_compiles_as_often_as_without_the_probe_across_discoveries(
    schedule: str, compiled_part: str
) -> None:
    """The watch's changes of ``nn.Module.__call__``, and the wrappers it puts on the
    model's classes, fail no guard of the compiled code: dynamo compiles each frame as
    often as without the probe, and eager forward calls are still timed."""
    plain_losses, plain = run_across_discoveries(None, schedule, compiled_part)
    got = Installed()
    try:
        watch = got.probe.forward
        assert watch is not None
        losses, compiled = run_across_discoveries(watch, schedule, compiled_part)
        assert {HookedNet, torch.nn.CrossEntropyLoss} <= set(watch.patched)
        assert watch.discoveries == 1 + SCHEDULES[schedule].count("begin")
    finally:
        torch_hooks.uninstall(got.probe)
    assert sum(compiled.values()) == sum(plain.values()), (compiled, plain)
    assert losses == plain_losses
    assert len(got.drafts) == len(losses)
    # Eager forward calls are timed, at the first step (discovering) as after the watch's moves.
    assert got.drafts[0].samples == got.drafts[-1].samples == 16
    assert all(d.compute_s is not None and d.compute_s > 0 for d in got.drafts)
    assert got.errors() == []


def test_run_while_tracing_marks_functions_as_dynamo_itself_does() -> None:
    """The mark is dynamo's ``assume_constant_result``, set without importing dynamo."""
    import torch._dynamo

    def by_dynamo() -> None:
        pass

    torch._dynamo.assume_constant_result(by_dynamo)
    assert vars(run_while_tracing(lambda: None)) == vars(by_dynamo)
