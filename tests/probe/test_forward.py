"""The forward watch in this process: discovery of root classes, and nothing on nested calls."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from trainmedic.probe import forward, torch_hooks  # noqa: E402
from trainmedic.probe.env import ProbeConfig  # noqa: E402
from trainmedic.probe.runtime import Probe  # noqa: E402


class Clock:
    """A probe clock that moves only when told to (seconds)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))

    def forward(self, x: Any) -> Any:
        return self.body(x)


class OtherNet(Net):
    """Another model class (a subclass of nothing the probe patched)."""


class OtherNet2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        return self.linear(x)


class OwnCall(nn.Module):
    """A model class with its own ``__call__`` (it counts its calls)."""

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        return self.linear(x)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super().__call__(*args, **kwargs)


@pytest.fixture
def probe() -> Iterator[tuple[Probe, Clock]]:
    clock = Clock()
    p = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()), clock=clock)
    p.failed = True  # no channel: records are dropped, hooks still run
    base_call = nn.Module.__dict__["__call__"]
    p._install_torch(torch)
    try:
        yield p, clock
    finally:
        torch_hooks.uninstall(p)
        assert nn.Module.__dict__["__call__"] is base_call


_OPTIMIZER = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.01)
"""One optimizer for every test model, so that each step is the lead optimizer's."""


def train_step(model: nn.Module, clock: Clock, loss_fn: nn.Module | None = None) -> None:
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    opt = _OPTIMIZER
    x, y = torch.randn(2, 4), torch.tensor([0, 1])
    clock.t += 0.01
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    clock.t += 0.01
    loss.backward()
    clock.t += 0.01
    opt.step()


def own_call(cls: type) -> Any:
    return cls.__dict__.get("__call__")


def test_discovery_patches_only_the_classes_called_outermost(probe: tuple[Probe, Clock]) -> None:
    p, clock = probe
    watch = p.forward
    assert watch is not None and watch.discovering
    assert nn.Module.__dict__["__call__"] is not watch._base  # the generic wrapper
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(model, clock, loss_fn)
    assert not watch.discovering
    assert set(watch.patched) == {Net, nn.CrossEntropyLoss}
    # Nested modules never pass through the probe again.
    assert nn.Module.__dict__["__call__"] is watch._base
    for cls in (nn.Sequential, nn.Linear, nn.ReLU):
        assert own_call(cls) is None
    before = p.tracker.forwards if p.tracker else 0
    train_step(model, clock, loss_fn)
    assert p.tracker is not None
    assert p.tracker.forwards == before + 2  # the model and the loss, nothing nested
    assert p.tracker.train_steps == forward.DISCOVERY_STEPS + 1


def test_uninstall_puts_every_class_back(probe: tuple[Probe, Clock]) -> None:
    p, clock = probe
    model = OwnCall()
    own = own_call(OwnCall)
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(model, clock)
    watch = p.forward
    assert watch is not None and OwnCall in watch.patched
    assert own_call(OwnCall) is not own
    OwnCall.calls = 0
    train_step(model, clock)
    assert OwnCall.calls == 1  # the class's own __call__ still runs, once
    torch_hooks.uninstall(p)
    assert own_call(OwnCall) is own
    assert own_call(nn.CrossEntropyLoss) is None
    assert p.forward is None


def test_a_model_of_a_new_class_is_found_after_a_step_without_forward_calls(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    watch = p.forward
    assert watch is not None
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(Net(), clock)
    clock.t += forward.MIN_GAP_S
    other, loss_fn = OtherNet2(), nn.MSELoss()

    def step() -> None:
        opt = _OPTIMIZER
        clock.t += 0.01
        opt.zero_grad()
        loss_fn(other(torch.randn(2, 4)), torch.zeros(2, 3)).backward()
        opt.step()

    p._watch_forward(0.0)  # what the probe's thread does every 0.25 s
    step()  # neither OtherNet2 nor MSELoss is watched: the step ends with no forward seen
    p._watch_forward(0.25)
    assert watch.requested
    step()
    assert watch.discovering
    for _ in range(forward.DISCOVERY_STEPS):
        step()
    assert {OtherNet2, nn.MSELoss} <= set(watch.patched)
    assert p.tracker is not None
    before = p.tracker.forwards
    step()
    assert p.tracker.forwards == before + 2


def test_a_subclass_of_a_watched_class_needs_no_wrapper_of_its_own(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(Net(), clock)
    watch = p.forward
    assert watch is not None
    clock.t += forward.REDISCOVER_S
    sub = OtherNet()
    train_step(sub, clock)
    p._watch_forward(0.0)  # the probe's thread: a routine discovery is due
    for _ in range(forward.DISCOVERY_STEPS + 1):
        train_step(sub, clock)
    assert watch.discoveries == 2  # the routine one
    assert OtherNet not in watch.patched
    assert p.tracker is not None
    before = p.tracker.forwards
    train_step(sub, clock)
    assert p.tracker.forwards == before + 2


def test_a_request_starts_discovery_at_the_next_fetch_and_calls_end_it(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(Net(), clock)
    watch = p.forward
    assert watch is not None
    clock.t += forward.MIN_GAP_S
    watch.request()  # what the probe's thread does when steps stop but work goes on
    evaluator = OtherNet2()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(80, 4)))
    with torch.no_grad():
        for (x,) in data:  # an evaluation loop: no steps end
            evaluator(x)
    assert not watch.discovering
    assert OtherNet2 in watch.patched


def test_models_pickle_and_copy_as_without_the_probe(probe: tuple[Probe, Clock]) -> None:
    p, clock = probe
    model = Net()
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(model, clock)
    assert p.forward is not None and Net in p.forward.patched
    assert "forward" not in vars(model) and not model._forward_hooks
    clone = pickle.loads(pickle.dumps(model))
    twin = copy.deepcopy(model)
    x = torch.randn(2, 4)
    assert torch.equal(clone(x), model(x)) and torch.equal(twin(x), model(x))


def test_the_watch_stays_out_of_other_threads_and_nested_instances(
    probe: tuple[Probe, Clock],
) -> None:
    import threading

    p, clock = probe
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(Net(), clock)
    assert p.tracker is not None
    before = p.tracker.forwards
    thread = threading.Thread(target=lambda: Net()(torch.randn(2, 4)))
    thread.start()
    thread.join()
    assert p.tracker.forwards == before  # another thread's calls are not timed
    outer = Net()
    outer.body = nn.Sequential(Net(), nn.Linear(3, 3))  # a Net nested in a Net
    outer(torch.randn(2, 4))
    assert p.tracker.forwards == before + 1


def test_each_step_knows_its_batch_and_whether_autocast_was_on(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    assert p.tracker is not None
    drafts: list[Any] = []
    emit = p.tracker.emit
    p.tracker.emit = lambda draft: (drafts.append(draft), emit(draft))  # type: ignore[assignment]
    model = Net()
    for _ in range(forward.DISCOVERY_STEPS + 1):  # discovering, then watching the root classes
        train_step(model, clock)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_step(model, clock)
    assert [d.autocast for d in drafts] == [False] * (forward.DISCOVERY_STEPS + 1) + [True]
    assert {d.samples for d in drafts} == {2}
    assert all(d.compute_s is not None for d in drafts)


def _changes_seen_by(watch: forward.ForwardWatch, cls: type) -> int:
    """The watch's changes of ``cls`` and its bases: the version tags they cost it."""
    return sum(watch.changes.get(base, 0) for base in cls.__mro__)


def _ask_for_discoveries(
    watch: forward.ForwardWatch, clock: Clock, model: nn.Module, times: int, **step: Any
) -> None:
    """Ask for a discovery ``times`` times, each followed by enough steps to finish one."""
    for _ in range(times):
        clock.t += forward.MIN_GAP_S
        watch.request()
        for _ in range(forward.DISCOVERY_STEPS + 1):
            train_step(model, clock, **step)


def test_past_its_change_budget_a_root_class_keeps_its_wrapper_and_passes_calls_through(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    watch = p.forward
    assert watch is not None and p.tracker is not None
    watch.type_change_budget, watch.discovery_reserve = 12, 4
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(model, clock, loss_fn)
    wrapper = watch.patched[Net][0]
    removed = 0
    for _ in range(20):  # windows: the hooks off, then on again
        watch.suspend()
        removed += own_call(Net) is not wrapper
        before = p.tracker.forwards
        train_step(model, clock, loss_fn)
        assert p.tracker.forwards == before  # off: no forward call timed either way
        watch.resume()
        assert own_call(Net) is wrapper
        before = p.tracker.forwards
        train_step(model, clock, loss_fn)
        assert p.tracker.forwards == before + 2
    # nn.Module twice (discovery), Net once (patched): 3 of 12; then two per window
    # while 4 stay for discoveries: 3 + 2 + 2 = 7.
    assert removed == 2
    for cls in (Net, nn.CrossEntropyLoss):
        assert _changes_seen_by(watch, cls) == 7
    # The reserve: two more discoveries (two changes of nn.Module each), then none.
    _ask_for_discoveries(watch, clock, model, 4, loss_fn=loss_fn)
    assert watch.discoveries == 3 and watch.exhausted
    assert _changes_seen_by(watch, Net) == 11


def test_discoveries_stop_before_nn_module_passes_its_change_budget(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    watch = p.forward
    assert watch is not None and p.tracker is not None
    watch.type_change_budget, watch.discovery_reserve = 8, 0
    model = Net()
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(model, clock)
    begun = watch.discoveries
    _ask_for_discoveries(watch, clock, model, 10)
    assert watch.exhausted and not watch.discovering and not watch.pending
    assert watch.next_routine == float("inf")
    assert watch.discoveries - begun == 2  # 2 + 1 + 2 + 2 of 8: a fourth would pass it
    assert nn.Module.__dict__["__call__"] is watch._base
    before = p.tracker.forwards
    train_step(model, clock)
    assert p.tracker.forwards == before + 2  # what was found stays watched
    for cls in (Net, nn.CrossEntropyLoss, nn.Linear):
        assert _changes_seen_by(watch, cls) <= 8


def test_routine_discoveries_come_further_apart_while_they_find_nothing_new(
    probe: tuple[Probe, Clock],
) -> None:
    p, clock = probe
    watch = p.forward
    assert watch is not None
    model = Net()
    for _ in range(forward.DISCOVERY_STEPS):
        train_step(model, clock)
    gaps = [watch.next_routine - clock.t]

    def discover(net: nn.Module) -> None:
        clock.t = watch.next_routine
        watch.request()
        for _ in range(forward.DISCOVERY_STEPS + 1):
            train_step(net, clock)
        gaps.append(watch.next_routine - clock.t)

    for _ in range(8):
        discover(model)
    discover(OtherNet2())  # a new class: back to the first gap
    assert gaps == pytest.approx(
        [forward.REDISCOVER_S * 2**k for k in range(6)]
        + [forward.REDISCOVER_MAX_S] * 3
        + [forward.REDISCOVER_S]
    )


def test_the_change_budget_is_set_from_python_3_13_only() -> None:
    import sys

    budget = forward.TYPE_CHANGE_BUDGET
    if sys.version_info >= (3, 13):
        assert budget is not None and 2 * 200 <= budget < 1000
    else:
        assert budget is None
