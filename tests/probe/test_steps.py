"""The step tracker as a specification: events in, steps out, on a hand-driven clock."""

from __future__ import annotations

import pytest

from trainmedic.probe.steps import (
    EVAL_MIN_FORWARDS,
    HOLD_MAX_S,
    HOLD_MAX_SEGMENTS,
    LEAD_TAKEOVER,
    StepDraft,
    StepTracker,
)


class Loop:
    """Drives a tracker like a training loop would, with explicit times (seconds)."""

    def __init__(self) -> None:
        self.steps: list[StepDraft] = []
        self.tracker = StepTracker(emit=self.steps.append)
        self.t = 100.0

    def wait(self, seconds: float) -> None:
        self.t += seconds

    def fetch(self, seconds: float, samples: int | None = 8) -> None:
        self.tracker.loader_enter(self.t)
        self.t += seconds
        self.tracker.loader_exit(self.t, samples, fetched=True)

    def forward(self, seconds: float, samples: int | None = 8, grad: bool = True) -> None:
        self.tracker.forward_enter(self.t, samples, grad, autocast=False)
        self.t += seconds
        self.tracker.forward_exit(self.t, grad)

    def backward(self, seconds: float) -> None:
        self.tracker.backward_enter(self.t)
        self.t += seconds
        self.tracker.backward_exit(self.t)

    def optimizer(self, seconds: float, opt: object = "sgd") -> None:
        self.tracker.optimizer_enter(self.t)
        self.t += seconds
        self.tracker.optimizer_exit(self.t, opt)

    def train_step(
        self, fetch: float = 0.03, fwd: float = 0.01, bwd: float = 0.02, opt: float = 0.005
    ) -> None:
        self.fetch(fetch)
        self.forward(fwd)
        self.backward(bwd)
        self.optimizer(opt)


def test_optimizer_steps_split_time_into_data_wait_and_compute() -> None:
    loop = Loop()
    for _ in range(3):
        loop.train_step(fetch=0.03, fwd=0.01, bwd=0.02, opt=0.005)
        loop.wait(0.002)  # logging between steps: neither data nor compute
    assert [s.step for s in loop.steps] == [1, 2, 3]
    assert {s.source for s in loop.steps} == {"optimizer"}
    first, second = loop.steps[0], loop.steps[1]
    # The first step starts at its first activity (the fetch), later ones at the previous end.
    assert first.duration_s == pytest.approx(0.065)
    assert second.duration_s == pytest.approx(0.067)
    assert second.data_wait_s == pytest.approx(0.03)
    assert second.compute_s == pytest.approx(0.035)
    assert second.outside_s == pytest.approx(0.002)
    assert second.samples == 8
    assert second.autocast is False


def test_without_a_dataloader_host_time_outside_compute_is_data_wait() -> None:
    loop = Loop()
    for _ in range(2):
        loop.wait(0.04)  # the script builds its batch itself
        loop.forward(0.01, samples=16)
        loop.backward(0.02)
        loop.optimizer(0.005)
    step = loop.steps[1]
    assert step.loader_fetches == 0
    assert step.data_wait_s == pytest.approx(0.04)
    assert step.samples == 16  # from the outermost forward call's batch


def test_a_second_outermost_call_in_a_step_does_not_count_samples_twice() -> None:
    loop = Loop()
    loop.forward(0.01, samples=32)  # the model
    loop.forward(0.001, samples=32)  # the loss module, also an outermost call
    loop.backward(0.02)
    loop.optimizer(0.005)
    assert loop.steps[0].samples == 32


def test_gradient_accumulation_is_one_step_with_every_micro_batch() -> None:
    loop = Loop()
    for _ in range(4):
        loop.fetch(0.01, samples=8)
        loop.forward(0.01)
        loop.backward(0.01)
    loop.optimizer(0.005)
    assert len(loop.steps) == 1
    step = loop.steps[0]
    assert step.samples == 32
    assert step.loader_fetches == 4
    assert step.data_wait_s == pytest.approx(0.04)
    assert step.compute_s == pytest.approx(0.085)


def test_gradient_accumulation_without_a_loader_sums_micro_batches() -> None:
    loop = Loop()
    for _ in range(3):
        loop.forward(0.01, samples=4)
        loop.backward(0.01)
    loop.optimizer(0.005)
    assert [s.samples for s in loop.steps] == [12]


def test_backward_calls_become_steps_when_no_optimizer_ever_steps() -> None:
    loop = Loop()
    for _ in range(HOLD_MAX_SEGMENTS + 5):
        loop.wait(0.01)
        loop.forward(0.01)
        loop.backward(0.01)
        loop.wait(0.003)  # the manual parameter update
    # Every backward call ended a step; the update after the last one is still open.
    assert len(loop.steps) == HOLD_MAX_SEGMENTS + 5
    assert {s.source for s in loop.steps} == {"backward"}
    assert [s.step for s in loop.steps] == list(range(1, len(loop.steps) + 1))
    # Steps end at backward ends: each after the first covers update + batch + compute.
    assert loop.steps[5].duration_s == pytest.approx(0.033)


def test_slow_manual_steps_are_released_by_time() -> None:
    loop = Loop()
    for _ in range(3):
        loop.forward(0.01)
        loop.wait(HOLD_MAX_S / 2)
        loop.backward(0.01)
    assert len(loop.steps) == 3
    assert loop.tracker.mode == "backward"


def test_a_short_script_without_optimizer_reports_its_steps_at_exit() -> None:
    loop = Loop()
    for _ in range(5):
        loop.forward(0.01)
        loop.backward(0.01)
    assert loop.steps == []
    loop.tracker.finish(loop.t)
    assert len(loop.steps) == 5
    assert {s.source for s in loop.steps} == {"backward"}


def test_closure_backward_calls_inside_an_optimizer_step_are_not_steps() -> None:
    loop = Loop()
    for _ in range(3):
        loop.fetch(0.01)
        loop.tracker.optimizer_enter(loop.t)
        for _ in range(5):  # LBFGS evaluates the closure several times
            loop.forward(0.002, samples=8)
            loop.backward(0.002)
        loop.t += 0.001
        loop.tracker.optimizer_exit(loop.t, "lbfgs")
    assert [s.step for s in loop.steps] == [1, 2, 3]
    assert loop.steps[1].samples == 8
    assert loop.steps[1].compute_s == pytest.approx(0.021)


def test_the_first_optimizer_leads_and_others_fold_into_its_steps() -> None:
    loop = Loop()
    for _ in range(3):  # a GAN: discriminator, then generator
        loop.forward(0.01)
        loop.backward(0.01)
        loop.optimizer(0.002, opt="D")
        loop.forward(0.01)
        loop.backward(0.01)
        loop.optimizer(0.002, opt="G")
    assert len(loop.steps) == 3


def test_another_optimizer_takes_over_when_the_lead_stops_stepping() -> None:
    loop = Loop()
    loop.optimizer(0.001, opt="warmup")
    for _ in range(LEAD_TAKEOVER + 2):
        loop.optimizer(0.001, opt="main")
    assert len(loop.steps) == 1 + 3


def test_the_explicit_api_owns_the_steps_once_used() -> None:
    loop = Loop()
    for _ in range(3):
        loop.fetch(0.01)
        loop.forward(0.01)
        loop.backward(0.01)
        loop.optimizer(0.001)
        loop.tracker.api_step(loop.t)
    # The first optimizer step counted; the API call right after it adds no empty step.
    assert [s.source for s in loop.steps] == ["optimizer", "api", "api"]
    assert loop.steps[1].duration_s == pytest.approx(0.031)


def test_api_steps_work_without_torch_hooks() -> None:
    loop = Loop()
    for _ in range(3):
        loop.wait(0.1)
        loop.tracker.api_step(loop.t)
    assert [s.step for s in loop.steps] == [1, 2, 3]
    assert loop.steps[2].duration_s == pytest.approx(0.1)
    assert loop.steps[2].compute_s is None
    assert loop.steps[2].data_wait_s == 0.0  # nothing measured: no claim


def test_a_phase_is_its_own_record_and_leaves_the_train_step() -> None:
    loop = Loop()
    loop.train_step()
    loop.tracker.phase_enter(loop.t, "checkpoint")
    loop.wait(0.5)
    loop.tracker.phase_exit(loop.t)
    loop.train_step(fetch=0.03, fwd=0.01, bwd=0.02, opt=0.005)
    phases = [(s.phase, s.step) for s in loop.steps]
    assert phases == [("train", 1), ("checkpoint", 1), ("train", 2)]
    checkpoint, train = loop.steps[1], loop.steps[2]
    assert checkpoint.duration_s == pytest.approx(0.5)
    assert checkpoint.source == "api"
    assert train.duration_s == pytest.approx(0.065)


def test_steps_inside_a_named_phase_carry_its_name() -> None:
    loop = Loop()
    loop.tracker.phase_enter(loop.t, "finetune")
    loop.train_step()
    loop.train_step()
    loop.tracker.phase_exit(loop.t)
    assert [(s.phase, s.step) for s in loop.steps] == [("finetune", 1), ("finetune", 2)]


def test_an_evaluation_loop_between_train_steps_is_split_off() -> None:
    loop = Loop()
    for _ in range(10):
        loop.train_step()
    for _ in range(EVAL_MIN_FORWARDS + 4):
        loop.fetch(0.01)
        loop.forward(0.02, grad=False)
    loop.train_step()
    assert [s.phase for s in loop.steps[-2:]] == ["eval", "train"]
    evaluation, train = loop.steps[-2:]
    n = EVAL_MIN_FORWARDS + 4
    assert evaluation.duration_s == pytest.approx(n * 0.03)
    assert evaluation.data_wait_s == pytest.approx(n * 0.01)
    assert train.duration_s == pytest.approx(0.065)
    assert train.data_wait_s == pytest.approx(0.03)


def test_a_gradient_free_forward_in_every_step_is_not_an_evaluation() -> None:
    loop = Loop()
    for _ in range(30):  # a teacher model under no_grad, every step
        loop.fetch(0.01)
        loop.forward(0.01, grad=False)
        loop.forward(0.01)
        loop.backward(0.01)
        loop.optimizer(0.001)
    assert {s.phase for s in loop.steps} == {"train"}


def test_a_fetch_inside_a_closure_is_data_wait_not_compute() -> None:
    loop = Loop()
    loop.tracker.optimizer_enter(loop.t)
    loop.fetch(0.05)
    loop.forward(0.01)
    loop.backward(0.01)
    loop.t += 0.001
    loop.tracker.optimizer_exit(loop.t, "opt")
    step = loop.steps[0]
    assert step.data_wait_s == pytest.approx(0.05)
    assert step.compute_s == pytest.approx(0.021)


def test_an_optimizer_step_that_raised_does_not_leave_its_region_open() -> None:
    loop = Loop()
    loop.tracker.optimizer_enter(loop.t)  # raises before the post hook: no exit
    loop.t += 0.01
    loop.train_step()
    assert len(loop.steps) == 1
    assert loop.tracker.in_compute is False


def test_activity_and_phase_describe_the_training_thread() -> None:
    loop = Loop()
    assert loop.tracker.activity == "other"
    loop.tracker.loader_enter(loop.t)
    assert loop.tracker.activity == "data"
    loop.tracker.loader_exit(loop.t + 0.01, 8, fetched=True)
    loop.tracker.backward_enter(loop.t)
    assert loop.tracker.activity == "backward"
    loop.tracker.phase_enter(loop.t, "eval")
    assert loop.tracker.phase == "eval"


def test_reset_forgets_the_parent_in_a_forked_child() -> None:
    loop = Loop()
    loop.train_step()
    loop.tracker.backward_enter(loop.t)
    loop.tracker.reset()
    assert loop.tracker.train_steps == 0
    assert loop.tracker.in_compute is False
    loop.train_step()
    assert loop.steps[-1].step == 1


class Markers:
    def __init__(self) -> None:
        self.count = 0

    def segment_started(self) -> object | None:
        self.count += 1
        return f"event-{self.count}"


def test_the_listener_marks_each_steps_first_compute() -> None:
    loop = Loop()
    markers = Markers()
    loop.tracker.listener = markers
    loop.train_step()
    loop.fetch(0.01)
    expected = f"event-{markers.count + 1}"
    loop.forward(0.01)
    loop.backward(0.01)
    loop.optimizer(0.001)
    assert loop.steps[0].start_marker == "event-1"
    assert loop.steps[1].start_marker == expected


# --- optimizer steps compiled by torch.compile ------------------------------------------------


def compiled_step(loop: Loop, opt: object = "sgd") -> None:
    """A step of a compiled region: its forward and optimizer step run in compiled code,
    unseen; dynamo always runs ``backward()`` eagerly."""
    loop.fetch(0.03)
    loop.wait(0.01)  # the compiled forward
    loop.backward(0.02)
    loop.wait(0.005)  # the compiled optimizer step


def test_a_compiled_optimizer_step_ends_its_step_when_traced_then_backward_calls_do() -> None:
    loop = Loop()
    for _ in range(3):
        loop.train_step()
    # The first compiled call: dynamo traces the step, the post hook tells the tracker.
    loop.fetch(0.03)
    loop.wait(0.01)
    loop.backward(0.02)
    loop.tracker.optimizer_compiled(loop.t, "sgd")
    loop.tracker.optimizer_compiled(loop.t, "sgd")  # a second trace ends no step
    loop.wait(0.005)
    for _ in range(4):
        compiled_step(loop)
    assert [(s.step, s.source) for s in loop.steps] == [
        (1, "optimizer"),
        (2, "optimizer"),
        (3, "optimizer"),
        (4, "optimizer"),
        *((n, "backward") for n in range(5, 9)),
    ]
    # One step per iteration: from one backward call's end to the next.
    assert [s.duration_s for s in loop.steps[4:]] == pytest.approx([0.065] * 4)
    assert all(s.data_wait_s == pytest.approx(0.03) for s in loop.steps)


def test_a_loop_compiled_from_its_first_step_gets_a_step_per_iteration() -> None:
    loop = Loop()
    loop.fetch(0.03)
    loop.wait(0.01)
    loop.backward(0.02)  # held: no optimizer step was seen yet
    loop.tracker.optimizer_compiled(loop.t, "adam")
    for _ in range(3):
        compiled_step(loop)
    assert [(s.step, s.source) for s in loop.steps] == [
        (1, "optimizer"),
        (2, "backward"),
        (3, "backward"),
        (4, "backward"),
    ]
    assert loop.steps[0].duration_s == pytest.approx(0.06)


def test_an_optimizer_whose_hooks_run_again_ends_steps_again() -> None:
    """Dynamo gave up compiling the region (its recompilation limit): the step runs
    eagerly, hooks and all; its backward call already ended the iteration's step."""
    loop = Loop()
    loop.train_step()
    loop.fetch(0.03)
    loop.backward(0.02)
    loop.tracker.optimizer_compiled(loop.t, "sgd")
    compiled_step(loop)
    loop.train_step()  # eager again
    loop.train_step()
    assert [(s.step, s.source) for s in loop.steps] == [
        (1, "optimizer"),
        (2, "optimizer"),  # at the trace
        (3, "backward"),
        (4, "backward"),  # the first eager iteration ends at its backward call
        (5, "optimizer"),
    ]
    # The last eager iteration's optimizer step goes to the next step.
    assert loop.steps[4].duration_s == pytest.approx(0.005 + 0.065)


def test_a_compiled_optimizer_that_is_not_the_lead_marks_no_steps() -> None:
    loop = Loop()
    for _ in range(3):
        loop.train_step(opt=0.005)  # "sgd" leads
    loop.tracker.optimizer_compiled(loop.t, "critic")  # a second optimizer, compiled
    for _ in range(2):
        loop.train_step()
    assert [s.source for s in loop.steps] == ["optimizer"] * 5
