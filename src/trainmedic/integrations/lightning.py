"""PyTorch Lightning: ``Trainer(callbacks=[TrainmedicCallback()])``.

* a step per optimizer step (Lightning's ``global_step`` advancing; with
  gradient accumulation, one step per accumulated batch group);
* validation (the sanity check included), testing and prediction as phases
  ``eval``, ``test`` and ``predict``;
* every checkpoint the trainer saves (``ModelCheckpoint``, ``trainer.save_checkpoint``)
  inside phase ``checkpoint``: the trainer's ``save_checkpoint`` is wrapped for
  the fit and restored at its end.

Works with ``lightning`` (``lightning.pytorch``) and ``pytorch_lightning``.
"""

from __future__ import annotations

import functools
from typing import Any

from trainmedic.api import step
from trainmedic.integrations._phases import PhaseStack

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback


class TrainmedicCallback(Callback):  # type: ignore[misc]
    """Marks Lightning's steps and phases for trainmedic (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.phases = PhaseStack()
        self._global_step: int | None = None
        self._wrapped: list[tuple[Any, Any]] = []

    # --- steps --------------------------------------------------------------------------------

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        current = int(trainer.global_step)
        if self._global_step is not None and current != self._global_step:
            step()
        self._global_step = current

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = int(trainer.global_step)

    # --- phases -------------------------------------------------------------------------------

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.phases.enter("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.phases.exit("eval")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.phases.enter("test")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.phases.exit("test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.phases.enter("predict")

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self.phases.exit("predict")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.phases.close_all()

    # --- checkpoints --------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if any(owner is trainer for owner, _ in self._wrapped):
            return
        original = trainer.save_checkpoint
        phases = self.phases

        @functools.wraps(original)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            phases.enter("checkpoint")
            try:
                return original(*args, **kwargs)
            finally:
                phases.exit("checkpoint")

        trainer.save_checkpoint = save_checkpoint
        self._wrapped.append((trainer, original))

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.phases.close_all()
        for owner, original in list(self._wrapped):
            if owner is trainer:
                trainer.save_checkpoint = original
                self._wrapped.remove((owner, original))


__all__ = ["TrainmedicCallback"]
