"""Checkpointer: atomic writes, integrity, fallback, keep-N, weights_only, crash consistency."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import stat
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _checkpoint_crash_child import MODEL_SHAPE, crash_child
from trainmedic.checkpoint import CHECKPOINT_DIR_ENV, Checkpointer, CheckpointWarning
from trainmedic.errors import CheckpointError, UsageError

# --------------------------------------------------------------------- builders


@dataclass
class Training:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def make_training(seed: int) -> Training:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**seed)
    return Training(model, optimizer, scheduler, scaler)


def train_steps(t: Training, n: int) -> None:
    for _ in range(n):
        loss = t.model(torch.randn(5, 4)).pow(2).mean()
        t.optimizer.zero_grad()
        t.scaler.scale(loss).backward()
        t.scaler.step(t.optimizer)
        t.scaler.update()
        t.scheduler.step()


def draw_randoms() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def make_checkpoints(directory: Path, steps: list[int], keep: int = 10) -> Checkpointer:
    ckpt = Checkpointer(directory, keep=keep)
    model = torch.nn.Linear(2, 2)
    for step in steps:
        with torch.no_grad():
            model.weight.fill_(step)
        ckpt.save(step, model=model, extra={"step": step})
    return ckpt


def data_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("ckpt-*.pt"))


def newest_data_file(ckpt: Checkpointer) -> Path:
    return ckpt.checkpoints()[0].data


# ------------------------------------------------------------------- round trip


def test_round_trip_restores_every_state_and_the_random_streams(tmp_path: Path) -> None:
    saved = make_training(seed=1)
    train_steps(saved, 3)
    saved.scaler.update(new_scale=512.0)
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(
        7,
        model=saved.model,
        optimizer=saved.optimizer,
        scheduler=saved.scheduler,
        scaler=saved.scaler,
        extra={"epoch": 2, "history": [0.5, 0.25], "tag": "run-a"},
    )
    expected_draws = draw_randoms()

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    resumed = make_training(seed=2)
    step = Checkpointer(tmp_path / "ckpt").load(
        model=resumed.model,
        optimizer=resumed.optimizer,
        scheduler=resumed.scheduler,
        scaler=resumed.scaler,
    )

    assert step == 7
    for a, b in zip(
        saved.model.state_dict().values(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    saved_momentum = [saved.optimizer.state[p]["momentum_buffer"] for p in saved.model.parameters()]
    resumed_momentum = [
        resumed.optimizer.state[p]["momentum_buffer"] for p in resumed.model.parameters()
    ]
    for a, b in zip(saved_momentum, resumed_momentum, strict=True):
        assert torch.equal(a, b)
    assert resumed.scheduler.last_epoch == 3
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert resumed.scaler.get_scale() == 512.0
    assert draw_randoms() == expected_draws


def test_load_exposes_extra_and_resumed_metadata(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [10, 20])
    assert ckpt.load() == 20
    assert ckpt.resumed is not None
    assert ckpt.resumed.extra == {"step": 20}
    assert ckpt.resumed.sequence == 2
    assert ckpt.resumed.skipped == ()


def test_nothing_to_resume_returns_none(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "never-created").load() is None
    assert Checkpointer(tmp_path).load(model=torch.nn.Linear(2, 2)) is None


# ---------------------------------------------------------------------- keep-N


def test_keeps_only_the_newest_n_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [1, 2, 3, 4, 5], keep=2)
    assert [c.step for c in ckpt.checkpoints()] == [5, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000004-step4.json",
        "ckpt-000004-step4.pt",
        "ckpt-000005-step5.json",
        "ckpt-000005-step5.pt",
    ]


def test_interrupted_save_is_ignored_on_load_and_cleaned_on_next_save(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [1, 2])
    # What a crash between the data rename and the manifest rename leaves behind,
    # plus a temporary file from a crash mid-write.
    (tmp_path / "ckpt-000003-step3.pt").write_bytes(b"complete but uncommitted")
    (tmp_path / ".ckpt-ckpt-000003-step3.pt.abc.tmp").write_bytes(b"half")
    assert ckpt.load() == 2
    ckpt.save(4, extra={})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "ckpt-000003-step3.pt" not in names
    assert not [n for n in names if n.endswith(".tmp")]
    assert [c.step for c in ckpt.checkpoints()] == [4, 2, 1]


# -------------------------------------------------------------------- fallback


def test_corrupt_latest_falls_back_to_the_previous_with_a_warning(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [100, 200])
    newest = newest_data_file(ckpt)
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    newest.write_bytes(bytes(raw))

    model = torch.nn.Linear(2, 2)
    with pytest.warns(CheckpointWarning, match="sha256 mismatch"):
        step = ckpt.load(model=model)
    assert step == 100
    assert torch.all(model.weight == 100)
    assert ckpt.resumed is not None
    assert ckpt.resumed.skipped[0][0] == newest.name


def test_truncated_latest_falls_back_to_the_previous(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [100, 200])
    newest = newest_data_file(ckpt)
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.warns(CheckpointWarning, match="truncated"):
        assert ckpt.load() == 100


def test_missing_data_file_falls_back(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [100, 200])
    newest_data_file(ckpt).unlink()
    with pytest.warns(CheckpointWarning, match="data file missing"):
        assert ckpt.load() == 100


def test_all_checkpoints_corrupt_raises_naming_every_file(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [100, 200])
    for path in data_files(tmp_path):
        path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError) as raised:
        ckpt.load()
    message = str(raised.value)
    assert "ckpt-000001-step100.pt" in message and "ckpt-000002-step200.pt" in message
    assert len(raised.value.problems) == 2


def test_saving_after_a_fallback_orders_by_save_not_by_step(tmp_path: Path) -> None:
    # The corrupt step-300 checkpoint belongs to an abandoned timeline: after
    # resuming from 200 and saving 250, 250 is the newest and keep=1 keeps it.
    ckpt = make_checkpoints(tmp_path, [200, 300], keep=2)
    newest_data_file(ckpt).write_bytes(b"garbage")
    with pytest.warns(CheckpointWarning):
        assert ckpt.load() == 200
    one = Checkpointer(tmp_path, keep=1)
    one.save(250, extra={})
    assert [c.step for c in one.checkpoints()] == [250]
    assert one.load() == 250


# ---------------------------------------------------------------- weights_only


class _Armed:
    """Unpickling this creates ``marker``: proof that arbitrary code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_checkpoint_holding_an_arbitrary_object_is_refused_without_running_it(
    tmp_path: Path,
) -> None:
    ckpt_dir = tmp_path / "ckpt"
    ckpt = make_checkpoints(ckpt_dir, [5])
    info = ckpt.checkpoints()[0]
    marker = tmp_path / "code-ran"
    payload = {"format": "trainmedic-checkpoint", "version": 1, "step": 5, "extra": {}}
    payload["extra"] = {"evil": _Armed(str(marker))}
    torch.save(payload, info.data)
    manifest = json.loads(info.manifest.read_text())
    manifest["size_bytes"] = info.data.stat().st_size
    manifest["sha256"] = __import__("hashlib").sha256(info.data.read_bytes()).hexdigest()
    info.manifest.write_text(json.dumps(manifest))

    with pytest.raises(CheckpointError, match=r"weights_only=True"):
        ckpt.load()
    assert not marker.exists()
    # The same file is armed: an unrestricted load does run the code.
    torch.load(info.data, weights_only=False)
    assert marker.exists()


def test_save_rejects_extra_values_that_could_not_be_loaded(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(UsageError, match=r"extra\['stats'\]\[1\]: a numpy.ndarray"):
        ckpt.save(1, extra={"stats": [1.0, np.zeros(3)]})
    assert list(tmp_path.iterdir()) == []
    ckpt.save(1, extra={"ok": [1, 2.5, "x", b"y", (None, True)], "t": torch.ones(2), "n": 2**70})
    assert ckpt.load() == 1
    assert ckpt.resumed is not None and ckpt.resumed.extra["n"] == 2**70


# ------------------------------------------------------------ mismatched loads


def test_asking_for_a_state_the_checkpoint_lacks_raises(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [3])
    t = make_training(seed=0)
    with pytest.raises(CheckpointError, match="has no optimizer state"):
        ckpt.load(optimizer=t.optimizer)


def test_a_model_of_another_shape_raises(tmp_path: Path) -> None:
    ckpt = make_checkpoints(tmp_path, [3])
    with pytest.raises(CheckpointError, match="model state does not fit"):
        ckpt.load(model=torch.nn.Linear(3, 3))


# ----------------------------------------------------------- when to save


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_maybe_save_every_steps_counts_from_the_last_save_or_resume(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, every_steps=10, keep=100)
    saved = [s for s in range(1, 36) if ckpt.maybe_save(s, extra={}) is not None]
    assert saved == [10, 20, 30]
    resumed = Checkpointer(tmp_path, every_steps=10, keep=100)
    assert resumed.load() == 30
    saved_after = [s for s in range(31, 56, 3) if resumed.maybe_save(s, extra={}) is not None]
    assert saved_after == [40, 52]


def test_maybe_save_every_seconds_uses_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    ckpt = Checkpointer(tmp_path, every_seconds=60, clock=clock, keep=100)
    saved = []
    for step in range(1, 20):
        clock.now += 25
        if ckpt.maybe_save(step, extra={}) is not None:
            saved.append(step)
    # 25 s per step: due after 60 s, i.e. every third step.
    assert saved == [3, 6, 9, 12, 15, 18]


def test_maybe_save_without_an_interval_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="every_steps or every_seconds"):
        Checkpointer(tmp_path).maybe_save(1)


# ------------------------------------------------------- directory and access


def test_directory_and_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        make_checkpoints(tmp_path / "a" / "b", [1])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    files = list((tmp_path / "a" / "b").iterdir())
    assert len(files) == 2
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_directory_defaults_to_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path / "from-env"))
    Checkpointer().save(4, extra={})
    assert [c.step for c in Checkpointer(tmp_path / "from-env").checkpoints()] == [4]
    monkeypatch.delenv(CHECKPOINT_DIR_ENV)
    with pytest.raises(UsageError, match=CHECKPOINT_DIR_ENV):
        Checkpointer()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [({"keep": 0}, "keep"), ({"every_steps": 0}, "every_steps"), ({"every_seconds": -1}, "every")],
)
def test_bad_settings_are_usage_errors(
    tmp_path: Path, kwargs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(UsageError, match=problem):
        Checkpointer(tmp_path, **kwargs)


# --------------------------------------------------------- crash consistency


@dataclass
class CrashStats:
    kills: int = 0
    writes_begun: int = 0
    kills_mid_write: int = 0


def _drain(conn: Connection) -> Iterator[tuple[str, int]]:
    while True:
        try:
            yield conn.recv()
        except EOFError:
            return


def run_crash_loop(
    directory: Path, min_writes: int, seed: int, min_kills: int = 0
) -> CrashStats:
    """Start a child, let it write a few checkpoints, SIGKILL it mid-write; repeat.

    After every kill, the newest loadable checkpoint must load, hold exactly its
    step in every value, and be at least as new as the last save the child
    reported complete.
    """
    rng = random.Random(seed)
    ctx = multiprocessing.get_context("forkserver")
    # The fork server imports torch once, so each child starts in milliseconds.
    # pytest is preloaded because each child re-imports the main module (the
    # pytest script) and Python 3.11's fork server cannot preload it itself.
    ctx.set_forkserver_preload(["torch", "trainmedic.checkpoint", "pytest"])
    stats = CrashStats()
    last_done = 0
    verifier = torch.nn.Linear(*MODEL_SHAPE, bias=False)
    # Writes begun per kill vary with how many saves land between the kill and
    # the drain, so both counts are looped for rather than hoped for.
    while stats.writes_begun < min_writes or stats.kills < min_kills:
        leftovers_before = _leftovers(directory)
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        child = ctx.Process(target=crash_child, args=(str(directory), child_conn), daemon=True)
        child.start()
        child_conn.close()
        try:
            kind, resumed_step = parent_conn.recv()
            assert kind == "resumed"
            assert resumed_step >= last_done
            kill_after = rng.randint(1, 4)
            begun = 0
            while begun < kill_after:
                kind, step = parent_conn.recv()
                if kind == "begin":
                    begun += 1
                    stats.writes_begun += 1
                else:
                    last_done = step
            # A save takes about a millisecond: land the kill inside one.
            time.sleep(rng.uniform(0.0, 0.0015))
            child.kill()
        finally:
            child.join(timeout=30)
        assert child.exitcode == -9
        stats.kills += 1
        for kind, step in _drain(parent_conn):
            if kind == "done":
                last_done = step
            elif kind == "begin":
                stats.writes_begun += 1
        parent_conn.close()
        stats.kills_mid_write += bool(_leftovers(directory) - leftovers_before)

        with warnings.catch_warnings():
            warnings.simplefilter("error", CheckpointWarning)  # no committed one may be damaged
            loaded = Checkpointer(directory).load(model=verifier)
        if loaded is None:  # killed before its first save was committed
            assert last_done == 0
        else:
            assert loaded >= last_done
            assert torch.all(verifier.weight == float(loaded))
    return stats


def _leftovers(directory: Path) -> set[str]:
    """Traces of an interrupted save: temporary files and data files without a manifest."""
    if not directory.exists():
        return set()
    return {
        p.name
        for p in directory.iterdir()
        if p.name.endswith(".tmp") or (p.suffix == ".pt" and not p.with_suffix(".json").exists())
    }


def test_sigkill_during_writes_never_loses_a_committed_checkpoint(tmp_path: Path) -> None:
    stats = run_crash_loop(tmp_path / "ckpt", min_writes=80, seed=1, min_kills=30)
    # The test must actually hit the write window, not only the gaps between
    # saves (about 29 of 31 kills do on a 2-core machine).
    assert stats.kills_mid_write >= 8


@pytest.mark.slow
def test_sigkill_during_hundreds_of_writes_never_loses_a_committed_checkpoint(
    tmp_path: Path,
) -> None:
    stats = run_crash_loop(tmp_path / "ckpt", min_writes=200, seed=2)
    assert stats.writes_begun >= 200
    assert stats.kills_mid_write >= 25


# ------------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_cuda_round_trip_restores_device_states_and_the_cuda_random_stream(
    tmp_path: Path,
) -> None:
    device = torch.device("cuda")
    torch.manual_seed(1)
    model = torch.nn.Linear(8, 4).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda", init_scale=256.0)
    loss = model(torch.randn(2, 8, device=device)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.manual_seed(5)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, model=model, optimizer=optimizer, scaler=scaler)
    expected = torch.rand(4, device=device).tolist()

    torch.cuda.manual_seed(99)
    resumed = torch.nn.Linear(8, 4).to(device)
    resumed_opt = torch.optim.Adam(resumed.parameters())
    resumed_scaler = torch.amp.GradScaler("cuda", init_scale=1.0)
    assert ckpt.load(model=resumed, optimizer=resumed_opt, scaler=resumed_scaler) == 3
    assert torch.rand(4, device=device).tolist() == expected
    assert torch.equal(resumed.weight, model.weight)
    assert resumed.weight.device.type == "cuda"
    state = resumed_opt.state[resumed.weight]["exp_avg"]
    assert state.device.type == "cuda"
    assert resumed_scaler.get_scale() == scaler.get_scale()
