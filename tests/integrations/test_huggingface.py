"""The Hugging Face Trainer callback on a tiny model on CPU: steps, evaluation, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (trainmedic[hf])"
)
pytest.importorskip("accelerate", reason="accelerate is not installed (trainmedic[hf])")
torch = pytest.importorskip("torch")

from tests.integrations.recorder import recording  # noqa: E402

from trainmedic.integrations.huggingface import TrainmedicCallback  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):  # type: ignore[no-untyped-def]
        logits = self.layer(x)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def args(tmp_path: Path, **extra: object) -> object:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        num_train_epochs=1, report_to=[], use_cpu=True, logging_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("accumulate", [1, 2])
def test_steps_evaluation_and_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          accumulate: int) -> None:  # fmt: skip
    trainer = transformers.Trainer(
        model=Tiny(),
        args=args(
            tmp_path,
            eval_strategy="steps",
            eval_steps=2,
            save_strategy="steps",
            save_steps=4,
            gradient_accumulation_steps=accumulate,
        ),
        train_dataset=Data(32),
        eval_dataset=Data(8),
        callbacks=[TrainmedicCallback()],
    )
    with recording(monkeypatch) as rec:
        trainer.train()
        trainer.evaluate()
    steps = 8 // accumulate
    assert rec.calls.count("step") == trainer.state.global_step == steps
    phases = rec.phases()
    # Evaluations every 2 steps, then the direct evaluate(); saves every 4 steps,
    # each after that step's evaluation.
    assert phases.count("eval") == steps // 2 + 1
    assert phases.count("checkpoint") == steps // 4
    assert len(list(tmp_path.glob("checkpoint-*"))) == steps // 4
    first_save = phases.index("checkpoint")
    assert phases[first_save - 1] == "eval"
