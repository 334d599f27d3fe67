"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[TrainmedicCallback()])``.

* a step per optimizer step (``on_step_end``, after gradient accumulation);
* evaluation as phase ``eval``: opened at the step end where the trainer
  decides to evaluate (``control.should_evaluate``) or at the first prediction
  step of a direct ``trainer.evaluate()``, closed when the evaluation ends;
* checkpoint saving as phase ``checkpoint``: opened where the trainer decides
  to save (``control.should_save``), after any evaluation of that step, and
  closed when the save ends (``on_save``).

Add it after the trainer's default callbacks (``callbacks=[...]`` or
``trainer.add_callback``), so it sees their decisions for the step.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from trainmedic.api import step
from trainmedic.integrations._phases import PhaseStack


class TrainmedicCallback(TrainerCallback):  # type: ignore[misc]
    """Marks the Trainer's steps and phases for trainmedic (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.phases = PhaseStack()
        self._save_pending = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step()
        if getattr(control, "should_evaluate", False):
            self.phases.enter("eval")
            self._save_pending = bool(getattr(control, "should_save", False))
        elif getattr(control, "should_save", False):
            self.phases.enter("checkpoint")

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if "eval" not in self.phases.names:
            self.phases.enter("eval")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.exit("eval")
        if self._save_pending:
            self._save_pending = False
            self.phases.enter("checkpoint")

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None,
                   **kwargs: Any) -> None:  # fmt: skip
        self.phases.exit("eval")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.exit("checkpoint")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._save_pending = False
        self.phases.close_all()


__all__ = ["TrainmedicCallback"]
