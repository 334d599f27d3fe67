"""The Lightning callback on a tiny model on CPU: steps, evaluation, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

pl = pytest.importorskip(
    "lightning.pytorch", reason="lightning is not installed (trainmedic[lightning])"
)
torch = pytest.importorskip("torch")

from tests.integrations.recorder import recording  # noqa: E402

from trainmedic.integrations.lightning import TrainmedicCallback  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(x), y))

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n: int = 32) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(data, batch_size=4)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_steps_evaluation_and_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          accumulate: int) -> None:  # fmt: skip
    callback = TrainmedicCallback()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        callbacks=[callback, pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1)],
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=1,
    )
    original = trainer.save_checkpoint
    with recording(monkeypatch) as rec:
        trainer.fit(Tiny(), loader(), loader(8))
    # 8 batches per epoch, two epochs: one step per optimizer step.
    assert rec.calls.count("step") == trainer.global_step == 16 // accumulate
    phases = rec.phases()
    assert phases.count("eval") == 3  # the sanity check and one per epoch
    assert phases.count("checkpoint") == 2
    assert list(tmp_path.glob("*.ckpt"))
    assert trainer.save_checkpoint == original  # restored after the fit


def test_a_failing_fit_closes_its_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(Tiny):
        def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         callbacks=[TrainmedicCallback()], enable_progress_bar=False,
                         enable_checkpointing=False, default_root_dir=tmp_path)  # fmt: skip
    with recording(monkeypatch) as rec, pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(), loader(), loader(8))
    assert rec.phases() == ["eval"]  # opened and closed again
