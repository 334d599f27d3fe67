"""The compute hooks on a share of short steps: when they go off, when they come back,
and what the steps measured without them say (and do not say)."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from trainmedic.probe import detail as detail_mod
from trainmedic.probe.detail import (
    GAP_MIN_S,
    GAP_STEPS,
    LONG_STEP_S,
    OVERDUE_S,
    WARMUP_STEPS,
    WINDOW_STEPS,
    DetailHook,
    DetailSwitch,
)
from trainmedic.probe.steps import StepDraft, StepTracker


class Job:
    """A training loop whose compute hooks exist only while the switch has them on.

    The loader and the optimizer's post-step hook always run, as in the probe.
    """

    def __init__(self, enabled: bool = True, seed: int = 1, armed: bool = True) -> None:
        self.steps: list[StepDraft] = []
        self.armed = armed
        self.general = 0
        """Steps that ended the general way (the others the tracker closed alone)."""
        self.tracker = StepTracker(emit=self._emit)
        self.switch = DetailSwitch(self.tracker, enabled=enabled, rng=random.Random(seed))
        self.hooked = {"forward": True, "backward": True, "steps": True}
        self.changes: list[tuple[str, bool, str]] = []
        for name, any_thread in (("steps", False), ("forward", True), ("backward", True)):
            self.switch.add(
                DetailHook(name, self._setter(name, True), self._setter(name, False), any_thread)
            )
        self.t = 100.0

    def _setter(self, name: str, on: bool):  # type: ignore[no-untyped-def]
        def set_it() -> None:
            if self.hooked[name] != on:
                self.changes.append((name, on, "x"))
            self.hooked[name] = on

        return set_it

    def _emit(self, draft: StepDraft) -> None:
        self.general += 1
        self.steps.append(draft)
        self.switch.step_ended(draft)  # as the probe's _on_draft does
        if self.armed:
            self.switch.arm_gap(self.steps, 1 << 30)

    def fetch(self, seconds: float = 0.0002) -> None:
        tr, sw = self.tracker, self.switch
        tr.loader_enter(self.t)
        self.t += seconds
        if tr.loader_exit(self.t, 8, fetched=True):  # as the loader hook does
            sw.fetch_overflow()

    def forward(self, seconds: float = 0.0002, grad: bool = True) -> None:
        if self.hooked["forward"]:
            self.tracker.forward_enter(self.t, 8, grad, autocast=False)
        self.t += seconds
        if self.hooked["forward"]:
            self.tracker.forward_exit(self.t, grad)

    def backward(self, seconds: float = 0.0002) -> None:
        if self.hooked["backward"]:
            self.tracker.backward_enter(self.t)
        self.t += seconds
        if self.hooked["backward"]:
            self.tracker.backward_exit(self.t)

    def optimizer(self, seconds: float = 0.0001) -> None:
        if self.hooked["steps"]:
            self.tracker.optimizer_enter(self.t)
        self.t += seconds
        self.tracker.optimizer_exit(self.t, "sgd")

    def step(self, fetches: int = 1, host: float = 0.0001, fwd: float = 0.0002) -> None:
        for _ in range(fetches):
            self.fetch()
        self.forward(fwd)
        self.t += host  # the script's own host work between calls
        self.backward()
        self.optimizer()

    def all_on(self) -> bool:
        return all(self.hooked.values())

    def all_off(self) -> bool:
        return not any(self.hooked.values())


def on_off_runs(job: Job, steps: int, host: float) -> list[tuple[bool, int]]:
    """Runs of steps after the warm-up with the hooks on / off: ``(on, steps)``."""
    pattern: list[bool] = []
    for _ in range(steps):
        pattern.append(job.all_on())
        assert job.all_on() or job.all_off()  # never half way at a step's start
        job.step(host=host)
    assert all(pattern[:WARMUP_STEPS])
    assert not pattern[WARMUP_STEPS]
    runs: list[tuple[bool, int]] = []
    for on in pattern[WARMUP_STEPS:]:
        if runs and runs[-1][0] == on:
            runs[-1] = (on, runs[-1][1] + 1)
        else:
            runs.append((on, 1))
    return runs


def test_after_the_warm_up_short_steps_get_the_hooks_in_windows() -> None:
    # 5 ms steps: long enough that the gaps are not stretched (GAP_MIN_S).
    job = Job()
    steps = WARMUP_STEPS + 3 * GAP_STEPS[1] + 3 * WINDOW_STEPS
    runs = on_off_runs(job, steps, host=0.0043)
    windows = [n for on, n in runs[:-1] if on]
    gaps = [n for on, n in runs[:-1] if not on]
    assert len(windows) >= 2 and set(windows) == {WINDOW_STEPS}
    assert gaps and all(GAP_STEPS[0] <= n <= GAP_STEPS[1] for n in gaps)
    assert job.switch.windows == len(windows) + (1 if runs[-1][0] else 0)
    # Hooks on a small share of the steps, whatever the model's depth.
    share = sum(n for on, n in runs if on) / (steps - WARMUP_STEPS)
    expected = WINDOW_STEPS / (WINDOW_STEPS + sum(GAP_STEPS) / 2)  # 3 %
    assert 0.5 * expected < share < 2 * expected


@pytest.mark.parametrize("step_s", [0.0008, 0.0002])
def test_on_sub_millisecond_steps_the_windows_come_every_half_second(step_s: float) -> None:
    """The gaps stretch to a mean of GAP_MIN_S, keeping their spread: a window every
    0.1 s of 1 ms steps told nothing more and cost most of what the probe adds."""
    job = Job()
    fixed = 0.0002 + 0.0002 + 0.0002 + 0.0001  # fetch, forward, backward, optimizer
    host = step_s - fixed if step_s > fixed + 0.0001 else 0.0001
    step_s = fixed + host
    mean = sum(GAP_STEPS) / 2
    stretch = GAP_MIN_S / (step_s * mean)
    assert stretch > 2
    runs = on_off_runs(job, WARMUP_STEPS + int(4.2 * GAP_MIN_S / step_s), host=host)
    windows = [n for on, n in runs[:-1] if on]
    gaps = [n for on, n in runs[:-1] if not on]
    # The first gap follows the warm-up (no window timed yet): drawn as usual.
    assert GAP_STEPS[0] <= gaps[0] <= GAP_STEPS[1]
    stretched = gaps[1:]
    assert len(stretched) >= 2 and set(windows) == {WINDOW_STEPS}
    # The windows' own steps are a little longer (hooks on), so the stretch is at most this.
    assert all(0.8 * stretch * GAP_STEPS[0] <= n <= stretch * GAP_STEPS[1] + 1 for n in stretched)
    seconds = [n * step_s for n in stretched]
    assert all(
        0.8 * GAP_STEPS[0] / mean * GAP_MIN_S <= s <= GAP_STEPS[1] / mean * GAP_MIN_S * 1.01
        for s in seconds
    ), seconds


def test_a_window_begun_between_two_step_ends_is_followed_by_a_plain_gap() -> None:
    job = Job()
    for _ in range(WARMUP_STEPS + GAP_STEPS[1] + 2):
        job.step(host=0.0001)
    assert job.all_off()
    job.switch.fetch_overflow()  # mid-step: no step end to measure the window from
    runs = [job.all_on()]
    for _ in range(WINDOW_STEPS + 3):
        job.step(host=0.0001)
        runs.append(job.all_on())
    assert runs[:WINDOW_STEPS] == [True] * WINDOW_STEPS
    off = job.switch.countdown + sum(1 for on in runs if not on)
    assert GAP_STEPS[0] <= off <= GAP_STEPS[1] + 1


def test_steps_without_the_hooks_keep_their_data_wait_and_lose_only_compute() -> None:
    job = Job()
    for _ in range(WARMUP_STEPS + GAP_STEPS[1] + WINDOW_STEPS + 2):
        job.step(host=0.0001, fwd=0.0002)
    full = [s for s in job.steps if s.compute_s is not None]
    partial = [s for s in job.steps if s.compute_s is None]
    assert len(full) >= WARMUP_STEPS + WINDOW_STEPS - 1
    assert len(partial) >= GAP_STEPS[0]
    for s in job.steps:
        assert s.data_wait_s == pytest.approx(0.0002)
        assert s.duration_s == pytest.approx(0.0002 + 0.0002 + 0.0001 + 0.0002 + 0.0001)
    for s in full[1:]:
        # forward, backward and optimizer: everything but the fetch and the host work
        assert s.compute_s == pytest.approx(0.0005)
        assert s.outside_s == pytest.approx(0.0001)


def test_long_steps_steps_without_batches_and_phases_keep_every_hook() -> None:
    for how in ("long", "no_fetch", "phase"):
        job = Job()
        for i in range(WARMUP_STEPS + 2 * GAP_STEPS[1]):
            if how == "long":
                job.step(host=LONG_STEP_S)
            elif how == "no_fetch":
                job.forward()
                job.backward()
                job.optimizer()
            else:
                job.tracker.phase_enter(job.t, "warmup")
                job.step()
            assert job.all_on(), (how, i)
        assert all(s.compute_s is not None for s in job.steps), how


def test_disabled_sampling_keeps_every_hook_on_every_step() -> None:
    job = Job(enabled=False)
    for _ in range(WARMUP_STEPS + 2 * GAP_STEPS[1]):
        job.step()
        assert job.all_on()
    assert job.changes == []


def test_a_step_that_fetches_more_than_usual_gets_the_hooks_and_its_evaluation_split_out() -> None:
    job = Job()
    for _ in range(WARMUP_STEPS + 2):
        job.step()
    assert job.all_off()
    before = len(job.steps)
    # An evaluation loop of 12 batches between two train steps, then a train step.
    for _ in range(12):
        job.fetch()
        job.forward(grad=False)
    assert job.all_on()  # turned on at the third fetch, inside the step
    job.step()
    new = job.steps[before:]
    assert [s.phase for s in new] == ["eval", "train"]
    evaluation, train = new
    assert evaluation.compute_s is None  # its first forward calls were not seen
    assert train.compute_s == pytest.approx(0.0005)


def test_the_probes_thread_wakes_the_hooks_when_steps_stop() -> None:
    job = Job()
    for _ in range(WARMUP_STEPS + 2):
        job.step()
    assert job.all_off()
    assert not job.switch.overdue(job.t + OVERDUE_S / 2)
    job.t += OVERDUE_S  # a long pause between steps (an evaluation without a loader)
    assert job.switch.overdue(job.t)
    job.switch.wake()
    # Attribute-set hooks come back at once; torch's hook table waits for the thread.
    assert job.hooked == {"forward": True, "backward": True, "steps": False}
    work = job.tracker.work
    job.forward(grad=False)
    assert job.tracker.work == work + 1  # the pause's forward calls count as work again
    assert not job.switch.overdue(job.t + 10)  # woken once
    job.step()
    assert job.all_on()
    assert job.steps[-1].compute_s is None  # the woken step was partial
    job.step()
    assert job.steps[-1].compute_s is not None


def test_a_failing_hook_leaves_the_switch_state_consistent() -> None:
    job = Job()
    boom = DetailHook("bad", lambda: None, _raise, any_thread=True)
    job.switch.add(boom)
    with pytest.raises(RuntimeError):
        for _ in range(WARMUP_STEPS + 1):
            job.step()
    job.switch.enabled = False
    job.switch.restore()
    assert job.all_on() and job.switch.on


def test_once_torch_compile_traced_something_the_hooks_stay_on_for_good() -> None:
    job = Job()
    traced = [False]
    job.switch.compiled = lambda: traced[0]
    for _ in range(WARMUP_STEPS + 1):
        job.step()
    assert job.all_off()
    traced[0] = True  # a function calling the model was compiled while the hooks were off
    for _ in range(2 * GAP_STEPS[1]):
        job.step()
        assert job.all_on() or job.switch.on is False
    assert job.all_on() and not job.switch.enabled
    changes = len(job.changes)
    for _ in range(2 * GAP_STEPS[1]):
        job.step()
    assert len(job.changes) == changes  # never switched again


def test_dynamo_traced_reads_dynamos_frame_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types
    from collections import Counter, defaultdict

    fake = types.ModuleType("torch._dynamo.utils")
    counters: defaultdict[str, Counter[str]] = defaultdict(Counter)
    fake.counters = counters  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", fake)
    assert not detail_mod.dynamo_traced()
    assert "frames" not in counters  # read without adding keys to dynamo's defaultdict
    counters["frames"]["total"] += 1
    assert detail_mod.dynamo_traced()
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils")
    assert not detail_mod.dynamo_traced()


def _raise() -> None:
    raise RuntimeError("cannot detach")


def test_the_schedule_constants_keep_the_hooks_on_a_small_share() -> None:
    mean_gap = sum(GAP_STEPS) / 2
    assert WINDOW_STEPS / (WINDOW_STEPS + mean_gap) < 0.1
    assert detail_mod.EXTRA_FETCHES >= 1


# --- with torch: the real hooks taken off and put back ---------------------------------------


class TorchJob:
    """A small model trained from a DataLoader of 4-row batches, each step moving the
    fake clock ``t`` on by 0.5 ms."""

    def __init__(self, torch: Any, t: list[float]) -> None:
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        self.t = t
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.loss_fn = nn.CrossEntropyLoss()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
        self.loader = DataLoader(self.data, batch_size=4)

    def train(self, steps: int) -> None:
        done = 0
        while done < steps:
            for x, y in self.loader:
                self.t[0] += 0.0005
                self.opt.zero_grad()
                self.loss_fn(self.model(x), y).backward()
                self.opt.step()
                done += 1
                if done == steps:
                    return


def test_torch_hooks_come_off_and_back_and_an_evaluation_is_still_split_out() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.optim import optimizer as optimizer_mod
    from torch.utils.data import DataLoader

    from trainmedic.probe import torch_hooks
    from trainmedic.probe.env import ProbeConfig
    from trainmedic.probe.runtime import Probe

    t = [1000.0]
    p = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()),
              clock=lambda: t[0])  # fmt: skip
    p.failed = True  # no channel: records are dropped, hooks still run
    original_backward = torch.autograd.backward
    p._install_torch(torch)
    assert p.tracker is not None and p.detail is not None and p.forward is not None
    p.detail.compiled = lambda: False  # whatever other tests compiled in this process
    drafts: list[StepDraft] = []
    on_draft = p._on_draft
    p.tracker.emit = lambda d: (drafts.append(d), on_draft(d))  # type: ignore[func-returns-value]
    job = TorchJob(torch, t)
    model, data, train = job.model, job.data, job.train

    def hooks_on() -> tuple[bool, bool, bool]:
        wrapped = nn.Sequential.__dict__.get("__call__") is not None
        return (
            wrapped,
            torch.autograd.backward is not original_backward,
            len(optimizer_mod._global_optimizer_pre_hooks) > 0,
        )

    try:
        train(WARMUP_STEPS + 2)
        assert hooks_on() == (False, False, False)
        # An evaluation with its own loader between two train steps, hooks off.
        with torch.no_grad():
            for x, _ in DataLoader(data, batch_size=4):
                model(x)
        assert hooks_on() == (True, True, True)
        train(1)
        assert [d.phase for d in drafts[-2:]] == ["eval", "train"]
        assert drafts[-1].compute_s is not None
        # The next window: every hook back, and the steps in it fully timed.
        train(GAP_STEPS[1] + WINDOW_STEPS + 1)
        assert p.detail.windows >= 1
        timed = [d for d in drafts if d.phase == "train" and d.compute_s is not None]
        untimed = [d for d in drafts if d.phase == "train" and d.compute_s is None]
        assert len(untimed) >= GAP_STEPS[0]
        assert len(timed) >= WARMUP_STEPS
        assert all(d.loader_fetches == 1 and d.samples == 4 for d in untimed)
        while p.detail.on:  # into a gap
            train(1)
        # Steps stop (an evaluation without a loader): the probe's thread wakes the
        # wrappers it may set; torch's hook table waits for the next step's end.
        p._wake_detail()
        assert hooks_on() == (False, False, False)
        t[0] += OVERDUE_S
        p._wake_detail()
        assert hooks_on() == (True, True, False)
        work = p.tracker.work
        with torch.no_grad():
            model(torch.randn(2, 4))
        assert p.tracker.work == work + 1
        train(1)
        assert hooks_on() == (True, True, True)
        while p.detail.on:  # end in a gap: uninstall must restore hooks that are off
            train(1)
    finally:
        torch_hooks.uninstall(p)
    assert hooks_on() == (False, False, False)
    assert torch.autograd.backward is original_backward


def test_without_the_compute_hooks_a_steps_gpu_marker_is_taken_when_its_batch_arrives() -> None:
    """On CUDA the step's start event is recorded at its first compute; with the
    compute hooks off, at the end of its first fetch instead."""

    class Listener:
        def __init__(self, job: Job) -> None:
            self.job = job
            self.marks: list[float] = []

        def segment_started(self) -> object:
            self.marks.append(self.job.t)
            return self.job.t

    job = Job()
    listener = Listener(job)
    job.tracker.listener = listener
    for _ in range(3):
        job.step()
    step = job.steps[-1]
    assert step.start_marker == listener.marks[-1]
    # the first forward call, after the fetch
    assert step.start_marker == pytest.approx(step.t_end - step.duration_s + 0.0002)
    for _ in range(WARMUP_STEPS - 3):
        job.step()
    assert job.all_off()
    before = len(listener.marks)
    job.step(fetches=1)
    assert len(listener.marks) == before + 1  # one marker a step, with or without hooks
    step = job.steps[-1]
    assert step.compute_s is None
    assert step.start_marker == pytest.approx(step.t_end - step.duration_s + 0.0002)


# --- gap steps closed by the tracker alone (probe.steps.GapSteps) ------------------------------


def _drive(job: Job, seed: int, steps: int) -> list[tuple[object, ...]]:
    """A random training loop: mostly plain steps, and now and then each event that
    must end a gap step the general way. Returns what each step's end left behind."""
    rng = random.Random(seed)
    seen: list[tuple[object, ...]] = []
    for i in range(steps):
        roll = rng.random()
        if roll < 0.02:
            job.step(fetches=0)  # no batch: its data wait is its host time
        elif roll < 0.04:
            job.step(fetches=rng.randint(2, 5))  # an evaluation's batches, say
        elif roll < 0.05:
            job.step(host=LONG_STEP_S)
        elif roll < 0.06:
            job.fetch()
            job.tracker.optimizer_exit(job.t, "adam")  # another optimizer steps too
            job.step()
        elif roll < 0.065:
            job.tracker.phase_enter(job.t, "warmup")
            job.step()
            job.tracker.phase_exit(job.t)
        elif roll < 0.07:
            job.t += OVERDUE_S  # a pause between steps: the probe's thread wakes the hooks
            if job.switch.overdue(job.t):
                job.switch.wake()
            job.step()
        elif roll < 0.072 and i > steps // 2:
            job.tracker.api_step(job.t)  # the script's own step marks, from now on
        else:
            job.step(host=rng.choice((0.0001, 0.0003, 0.002)))
        seen.append((job.all_on(), len(job.steps), job.switch.windows))
    return seen


def _as_compared(draft: StepDraft) -> tuple[object, ...]:
    return (
        draft.step,
        draft.phase,
        draft.source,
        draft.t_end,
        draft.times(),
        draft.samples,
        draft.loader_fetches,
        draft.autocast,
    )


@pytest.mark.parametrize("seed", range(6))
def test_gap_steps_the_tracker_closes_alone_are_the_steps_the_general_close_makes(
    seed: int,
) -> None:
    armed, general = Job(seed=seed), Job(seed=seed, armed=False)
    steps = WARMUP_STEPS + 6 * GAP_STEPS[1]
    assert _drive(armed, seed, steps) == _drive(general, seed, steps)
    assert [_as_compared(d) for d in armed.steps] == [_as_compared(d) for d in general.steps]
    assert armed.changes == general.changes
    assert armed.switch.windows == general.switch.windows
    assert armed.switch.windows_ended == general.switch.windows_ended
    assert armed.tracker.steps_by_phase == general.tracker.steps_by_phase
    # The tracker closed most of them alone, and the general close made all of the other's.
    assert general.general == len(general.steps)
    assert armed.general < 0.5 * len(armed.steps)


def test_a_gap_ends_the_general_way_at_its_last_step_and_the_window_comes_on_time() -> None:
    job = Job()
    for _ in range(WARMUP_STEPS + 1):
        job.step(host=0.0043)
    assert job.all_off() and job.tracker.gap is not None
    gap = job.tracker.gap
    countdown = job.switch.countdown
    assert gap.left == countdown - 1  # the last step of the gap stays with the switch
    general = job.general
    for _ in range(countdown - 1):
        job.step(host=0.0043)
    assert job.general == general and gap.left == 0 and job.all_off()
    job.step(host=0.0043)
    assert job.general == general + 1 and job.all_on()
    assert job.tracker.gap is None


def test_the_probes_thread_reads_the_last_step_the_tracker_closed_alone() -> None:
    job = Job()
    for _ in range(WARMUP_STEPS + 3):
        job.step()
    assert job.tracker.gap is not None and job.general == WARMUP_STEPS
    assert not job.switch.overdue(job.t + OVERDUE_S / 2)
    assert job.switch.overdue(job.t + OVERDUE_S)
    job.switch.wake()
    assert job.tracker.gap is None  # the hooks came back: steps end the general way
    job.step()
    assert job.general == WARMUP_STEPS + 1


@pytest.mark.parametrize(
    "change",
    ["detail_on", "listener", "phase", "compiled", "api", "other_optimizer", "no_room"],
)
def test_the_tracker_is_not_armed_where_a_step_could_end_otherwise(change: str) -> None:
    job = Job(armed=False)
    for _ in range(WARMUP_STEPS + 1):
        job.step()
    tracker = job.tracker
    room = 1 << 30
    if change == "detail_on":
        tracker.set_detail(True, True)
    elif change == "listener":
        tracker.listener = type("L", (), {"segment_started": lambda self: None})()
    elif change == "phase":
        tracker.phase_enter(job.t, "warmup")
    elif change == "compiled":
        tracker.optimizer_compiled(job.t, "sgd")
    elif change == "api":
        tracker.api_step(job.t)
    elif change == "other_optimizer":
        tracker.optimizer_exit(job.t, "adam")
    else:
        room = len(job.steps)
    assert tracker.arm_gap(10, job.t, LONG_STEP_S, job.steps, room) is None
    assert tracker.gap is None


def test_room_in_the_outbox_bounds_the_steps_the_tracker_closes_alone() -> None:
    job = Job(armed=False)
    for _ in range(WARMUP_STEPS + 1):
        job.step()
    out: list[StepDraft] = []
    gap = job.tracker.arm_gap(50, job.t, LONG_STEP_S, out, 3)
    assert gap is not None and gap.left == 3
    for _ in range(5):
        job.step()
    assert len(out) == 3 and job.tracker.gap is None
    assert [d.step for d in out] == [WARMUP_STEPS + 2, WARMUP_STEPS + 3, WARMUP_STEPS + 4]
    assert [d.step for d in job.steps[-2:]] == [WARMUP_STEPS + 5, WARMUP_STEPS + 6]


def test_with_torch_the_gap_steps_go_to_the_outbox_numbered_with_the_others() -> None:
    torch = pytest.importorskip("torch")
    import threading

    from trainmedic.probe import torch_hooks
    from trainmedic.probe.env import ProbeConfig
    from trainmedic.probe.runtime import Probe

    t = [1000.0]
    p = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()),
              clock=lambda: t[0])  # fmt: skip
    p.failed = False  # a probe that sends: its steps are queued
    p._agent = threading.Thread()  # ... by a thread that never starts here
    p._install_torch(torch)
    assert p.tracker is not None and p.detail is not None
    p.detail.compiled = lambda: False  # whatever other tests compiled in this process
    general: list[StepDraft] = []
    on_draft = p._on_draft
    p.tracker.emit = lambda d: (general.append(d), on_draft(d))  # type: ignore[func-returns-value]
    steps = WARMUP_STEPS + GAP_STEPS[1] + WINDOW_STEPS + 20
    try:
        TorchJob(torch, t).train(steps)
    finally:
        torch_hooks.uninstall(p)
    drafts = [m for m in p.outbox if isinstance(m, StepDraft)]
    assert [d.step for d in drafts] == list(range(1, steps + 1))
    assert p.tracker.train_steps == steps
    alone = [d for d in drafts if not any(d is g for g in general)]
    assert len(alone) >= GAP_STEPS[0] - 1  # a gap's steps, but its last
    for d in alone:
        assert d.compute_s is None and d.loader_fetches == 1 and d.samples == 4
        assert d.phase == "train" and d.source == "optimizer"
        assert d.duration_s == pytest.approx(0.0005)
        assert d.data_wait_s == 0.0  # the fake clock stands still inside the fetch


# --- gap steps written straight into the shared-memory ring (steprings.RingGap) ----------------


class RingJob(Job):
    """A :class:`Job` whose steps go into a step ring, as a probe's do once the
    supervisor took it: the gap steps straight from their segments."""

    def __init__(self, seed: int, steps: Any, armed: bool) -> None:
        self.ring_steps = steps
        super().__init__(seed=seed, armed=armed)

    def _emit(self, draft: StepDraft) -> None:
        self.general += 1
        self.ring_steps.append(draft)  # as the probe's _on_draft does with a ring
        self.switch.step_ended(draft)
        if self.armed:
            self.switch.arm_gap(self.ring_steps, 1 << 30, self.ring_steps.gap)


def _ring_job(seed: int, armed: bool) -> tuple[RingJob, Any]:
    from collections import deque

    from trainmedic.channel.ring import RingReader, RingWriter
    from trainmedic.probe.steprings import RingSteps

    writer = RingWriter(capacity=4096)
    assert writer.fd is not None
    reader = RingReader(os.dup(writer.fd), pid=7, rank=None)
    return RingJob(seed, RingSteps(writer, 1.7e9, deque()), armed), reader


@pytest.mark.parametrize("seed", range(4))
def test_gap_steps_written_into_the_ring_are_the_records_their_drafts_make(seed: int) -> None:
    from trainmedic.channel import ring

    if not ring.available():
        pytest.skip("no memfd_create here")
    (armed, armed_reader), (general, general_reader) = _ring_job(seed, True), _ring_job(seed, False)
    steps = WARMUP_STEPS + 6 * GAP_STEPS[1]
    assert _drive(armed, seed, steps) == _drive(general, seed, steps)
    via_gap, via_drafts = armed_reader.drain(), general_reader.drain()
    assert len(via_gap) == len(via_drafts) == general.general
    assert via_gap == via_drafts  # every field, to the bit
    # Most of the armed job's steps went into the ring without a draft.
    assert armed.general < 0.5 * len(via_gap)
    assert not armed.ring_steps.overflow
    a, g = armed.ring_steps, general.ring_steps
    assert (a.train_s, a.wait_s, a.train_steps) == (g.train_s, g.wait_s, g.train_steps)
    assert a.train_steps == general.tracker.train_steps


def test_a_gap_step_the_ring_cannot_hold_goes_to_the_outbox_as_its_draft() -> None:
    from collections import deque

    from trainmedic.channel import ring
    from trainmedic.probe.segments import Segment
    from trainmedic.probe.steprings import RingGap, RingSteps

    if not ring.available():
        pytest.skip("no memfd_create here")
    overflow: deque[Any] = deque()
    steps = RingSteps(ring.RingWriter(capacity=8), 0.0, overflow)
    tracker = StepTracker(lambda d: None)
    tracker.steps_by_phase["train"] = 11
    seg = tracker.segment = Segment.of(
        t_start=1.0, fetches=1, loader_wait=0.25, loader_samples=1 << 70, partial=True
    )
    gap = steps.gap("sgd", 5, 1.5, 10.0, steps)
    assert isinstance(gap, RingGap)
    assert gap.close(tracker, 2.0, "sgd")
    ((draft, timing, alloc),) = overflow
    assert (draft.step, draft.phase, draft.source, draft.t_end) == (12, "train", "optimizer", 2.0)
    assert (draft.duration_s, draft.data_wait_s, draft.samples) == (1.0, 0.25, 1 << 70)
    assert timing is None and alloc is None
    assert steps.writer.written == 0 and steps.train_steps == 0
    # The draft keeps its segment; the next step has one of its own.
    assert draft.segment is seg and tracker.segment is not seg
    assert (tracker.segment.t_start, tracker.segment.fetches, tracker.segment.partial) == (
        2.0, 0, True,
    )  # fmt: skip
    assert gap.left == 4 and tracker.steps_by_phase["train"] == 12


def test_a_gap_step_in_the_ring_leaves_its_segment_as_a_new_one_begins() -> None:
    from collections import deque

    from trainmedic.channel import ring
    from trainmedic.probe.segments import Segment
    from trainmedic.probe.steprings import RingSteps

    if not ring.available():
        pytest.skip("no memfd_create here")
    writer = ring.RingWriter(capacity=8)
    assert writer.fd is not None
    reader = ring.RingReader(os.dup(writer.fd), pid=3, rank=None)
    steps = RingSteps(writer, 100.0, deque())
    tracker = StepTracker(lambda d: None)
    tracker.steps_by_phase["train"] = 4
    seg = tracker.segment = Segment.of(
        t_start=1.0, fetches=2, loader_wait=0.75, loader_samples=8, partial=True
    )
    gap = steps.gap("sgd", 3, 1.5, 10.0, steps)
    # Not the lead, or nothing fetched, or too long: not a gap step, nothing changed.
    assert not gap.close(tracker, 2.0, "adam")
    assert not gap.close(tracker, 12.0, "sgd")
    assert gap.left == 3 and writer.written == 0
    assert gap.close(tracker, 2.0, "sgd")
    (record,) = reader.drain()
    assert (record.step, record.duration_s, record.data_wait_s, record.samples) == (5, 1.0, 0.75, 8)
    assert record.compute_s is None and record.source == "optimizer" and record.phase == "train"
    fresh = Segment()
    fresh.t_start, fresh.partial = 2.0, True
    assert tracker.segment is seg  # reused, as the fresh segment it stands for
    fields = list(Segment.__annotations__)  # every accumulator
    assert len(fields) > 10
    assert {k: getattr(seg, k) for k in fields} == {k: getattr(fresh, k) for k in fields}
    assert not gap.close(tracker, 2.5, "sgd")  # the new segment fetched nothing yet
    assert (steps.train_s, steps.wait_s, steps.train_steps) == (1.0, 0.75, 1)


class SlowFetches:
    """A dataset each of whose rows takes 0.1 ms of the fake clock to load."""

    def __init__(self, torch: Any, t: list[float]) -> None:
        self.t = t
        self.x, self.y = torch.randn(64, 4), torch.randint(0, 3, (64,))

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        self.t[0] += 0.0001
        return self.x[i], self.y[i]


def _torch_ring_records(torch: Any, armed: bool, steps: int) -> tuple[list[Any], int]:
    """Train :class:`TorchJob` under a probe whose steps go into a ring; returns the
    records read back and how many steps ended the general way."""
    import threading
    from collections import deque

    from torch.utils.data import DataLoader

    from trainmedic.channel.ring import RingReader, RingWriter
    from trainmedic.probe import torch_hooks
    from trainmedic.probe.env import ProbeConfig
    from trainmedic.probe.runtime import Probe
    from trainmedic.probe.steprings import RingSteps

    t = [1000.0]
    p = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()),
              clock=lambda: t[0])  # fmt: skip
    p.failed = False
    p._agent = threading.Thread()  # a probe that sends, by a thread that never starts here
    p._install_torch(torch)
    assert p.tracker is not None and p.detail is not None
    p.detail.compiled = lambda: False  # whatever other tests compiled in this process
    p.detail.rng = random.Random(3)
    if not armed:
        p.detail.arm_gap = lambda *args: None  # type: ignore[method-assign]
    writer = RingWriter(capacity=4096)
    assert writer.fd is not None
    reader = RingReader(os.dup(writer.fd), pid=1, rank=None)
    p.ring = RingSteps(writer, 0.0, deque())
    general = [0]
    on_draft = p._on_draft

    def counted(draft: StepDraft) -> None:
        general[0] += 1
        on_draft(draft)

    p.tracker.emit = counted
    job = TorchJob(torch, t)
    job.loader = DataLoader(SlowFetches(torch, t), batch_size=4)
    try:
        job.train(steps)
    finally:
        torch_hooks.uninstall(p)
    return reader.drain(), general[0]


def test_with_torch_the_gap_steps_in_the_ring_are_the_records_the_general_close_writes() -> None:
    torch = pytest.importorskip("torch")
    from trainmedic.channel import ring

    if not ring.available():
        pytest.skip("no memfd_create here")
    steps = WARMUP_STEPS + 2 * (GAP_STEPS[1] + WINDOW_STEPS)
    armed, armed_general = _torch_ring_records(torch, True, steps)
    plain, plain_general = _torch_ring_records(torch, False, steps)
    assert [r.step for r in armed] == list(range(1, steps + 1))
    assert armed == plain  # every field of every step
    assert plain_general == steps and armed_general < steps - GAP_STEPS[0]
    gap = [r for r in armed if r.compute_s is None]
    assert len(gap) >= GAP_STEPS[0]
    for r in gap:  # four rows of 0.1 ms each, then the 0.5 ms the step itself moves on
        assert r.data_wait_s == pytest.approx(0.0004)
        assert r.duration_s == pytest.approx(0.0009)
        assert r.samples == 4 and r.source == "optimizer" and r.phase == "train"
