"""The :class:`Checkpointer`: when to save, saving, loading with fall-back, pruning
(the contract is in the package's docstring, :mod:`trainmedic.checkpoint`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.api import phase
from trainmedic.atomicfile import fsync_dir
from trainmedic.checkpoint.files import (
    FORMAT,
    FORMAT_VERSION,
    NAME_RE,
    TMP_PREFIX,
    TMP_SUFFIX,
    CheckpointInfo,
    Unusable,
    read_verified,
    write_file,
)
from trainmedic.checkpoint.state import (
    SupportsStateDict,
    capture_rng,
    check_weights_only_safe,
    restore,
)
from trainmedic.errors import CheckpointError, UsageError
from trainmedic.record.events import EventKind

CHECKPOINT_DIR_ENV = "TRAINMEDIC_CHECKPOINT_DIR"
"""Default checkpoint directory when ``directory`` is not given.

``trainmedic run`` sets it for the job so that a script using
``Checkpointer()`` resumes across restarts without naming a directory.
"""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (corrupt, truncated, refused) and an older one used."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What :meth:`Checkpointer.load` restored.

    Attributes:
        step: the step the checkpoint was saved at.
        sequence: its save order.
        path: the data file.
        extra: the ``extra`` dict given to :meth:`Checkpointer.save`.
        skipped: ``(file, problem)`` for newer checkpoints that could not be used.
    """

    step: int
    sequence: int
    path: Path
    extra: Mapping[str, Any] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()


class Checkpointer:
    """Saves and restores training state; see the module docstring for the contract.

    Args:
        directory: where checkpoints live; defaults to ``$TRAINMEDIC_CHECKPOINT_DIR``.
            Created (mode 0700) on the first save; an existing directory keeps
            its mode (files are 0600 either way).
        keep: how many of the newest checkpoints to keep (at least 1).
        every_steps: :meth:`maybe_save` saves when this many steps passed
            since the last save (or the resumed step).
        every_seconds: :meth:`maybe_save` saves when this many seconds passed
            on ``clock`` since the last save (or since construction).
        clock: monotonic clock in seconds; a seam for tests.

    In a ``torch.distributed`` job only global rank 0 writes (the others
    return ``None`` from :meth:`save`), and every rank may :meth:`load`.
    Sharded states (FSDP) need ``torch.distributed.checkpoint`` instead.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        keep: int = 3,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if directory is None:
            from_env = os.environ.get(CHECKPOINT_DIR_ENV, "").strip()
            if not from_env:
                raise UsageError(
                    f"no checkpoint directory: pass directory= or set {CHECKPOINT_DIR_ENV}"
                )
            directory = from_env
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise UsageError(f"keep must be an integer >= 1, got {keep!r}")
        if every_steps is not None and (
            isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1
        ):
            raise UsageError(f"every_steps must be an integer >= 1, got {every_steps!r}")
        if every_seconds is not None and not every_seconds > 0:
            raise UsageError(f"every_seconds must be > 0, got {every_seconds!r}")
        self.directory = Path(directory)
        self.keep = keep
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self._clock = clock
        self._last_save_step = 0
        self._last_save_time = clock()
        self.resumed: LoadedCheckpoint | None = None
        """The checkpoint the last successful :meth:`load` restored."""

    # ----------------------------------------------------------------- listing

    def checkpoints(self) -> list[CheckpointInfo]:
        """Committed checkpoints (those with a manifest), newest first.

        A data file without a manifest is an interrupted save and is not listed.
        """
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CheckpointError(
                f"checkpoint directory {self.directory} is unreadable: {e.strerror}",
                directory=str(self.directory),
            ) from e
        found = []
        for name in names:
            m = NAME_RE.match(name)
            if m and m["kind"] == "json":
                stem = name[: -len(".json")]
                found.append(
                    CheckpointInfo(
                        sequence=int(m["seq"]),
                        step=int(m["step"]),
                        manifest=self.directory / name,
                        data=self.directory / f"{stem}.pt",
                    )
                )
        found.sort(key=lambda c: c.sequence, reverse=True)
        return found

    # ------------------------------------------------------------------ saving

    def maybe_save(
        self,
        step: int,
        *,
        model: SupportsStateDict | None = None,
        optimizer: SupportsStateDict | None = None,
        scheduler: SupportsStateDict | None = None,
        scaler: SupportsStateDict | None = None,
        extra: Mapping[str, Any] | None = None,
        rng: bool = True,
    ) -> Path | None:
        """Save when ``every_steps`` or ``every_seconds`` says one is due.

        Returns the data file written, or ``None`` when no save was due (or
        this is not rank 0). Raises :class:`~trainmedic.errors.UsageError`
        when neither interval was configured.
        """
        if self.every_steps is None and self.every_seconds is None:
            raise UsageError("maybe_save needs every_steps or every_seconds on the Checkpointer")
        due = (
            self.every_steps is not None and step - self._last_save_step >= self.every_steps
        ) or (
            self.every_seconds is not None
            and self._clock() - self._last_save_time >= self.every_seconds
        )
        if not due:
            return None
        return self.save(
            step,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            extra=extra,
            rng=rng,
        )

    def save(
        self,
        step: int,
        *,
        model: SupportsStateDict | None = None,
        optimizer: SupportsStateDict | None = None,
        scheduler: SupportsStateDict | None = None,
        scaler: SupportsStateDict | None = None,
        extra: Mapping[str, Any] | None = None,
        rng: bool = True,
    ) -> Path | None:
        """Write a checkpoint for ``step`` now; return its data file.

        ``extra`` holds anything else to restore (epoch, sampler position,
        metrics): plain numbers, strings, bytes, lists, tuples, dicts and
        tensors only, because loading uses ``weights_only=True``; anything
        else raises :class:`~trainmedic.errors.UsageError` before writing.
        Returns ``None`` on ranks other than 0 of a distributed job.
        """

        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UsageError(f"step must be an integer >= 0, got {step!r}")
        extra_dict = dict(extra or {})
        check_weights_only_safe(extra_dict, "extra")
        if _is_nonzero_rank():
            # Keep the same schedule as rank 0, which does write.
            self._last_save_step = step
            self._last_save_time = self._clock()
            return None
        # Under `trainmedic run` the watchdog then gives the write the
        # checkpoint phase's bound instead of counting it as a slow step.
        with phase("checkpoint"):
            return self._save_now(step, model, optimizer, scheduler, scaler, extra_dict, rng)

    def _save_now(
        self,
        step: int,
        model: SupportsStateDict | None,
        optimizer: SupportsStateDict | None,
        scheduler: SupportsStateDict | None,
        scaler: SupportsStateDict | None,
        extra_dict: dict[str, Any],
        rng: bool,
    ) -> Path:
        import torch

        payload: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "step": step,
            "model": None if model is None else model.state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "rng": capture_rng() if rng else None,
            "extra": extra_dict,
        }
        self._ensure_directory()
        sequence = self._next_sequence()
        stem = f"ckpt-{sequence:06d}-step{step}"
        data_path, size, digest = write_file(
            self.directory, f"{stem}.pt", lambda f: torch.save(payload, f)
        )
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "sequence": sequence,
            "step": step,
            "data_file": data_path.name,
            "size_bytes": size,
            "sha256": digest,
            "created_at": time.time(),
            "torch_version": str(torch.__version__),
            "contents": sorted(
                k
                for k in ("model", "optimizer", "scheduler", "scaler", "rng")
                if payload[k] is not None
            ),
        }
        manifest_bytes = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        write_file(self.directory, f"{stem}.json", lambda f: f.write(manifest_bytes))
        self._last_save_step = step
        self._last_save_time = self._clock()
        self._prune(sequence)
        return data_path

    def _ensure_directory(self) -> None:
        if self.directory.is_dir():
            return
        try:
            self.directory.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            return
        # mkdir's mode is filtered by the umask; the directory must be private.
        os.chmod(self.directory, 0o700)
        fsync_dir(self.directory.parent)

    def _next_sequence(self) -> int:
        highest = 0
        for name in os.listdir(self.directory):
            m = NAME_RE.match(name)
            if m:
                highest = max(highest, int(m["seq"]))
        return highest + 1

    def _prune(self, newest: int) -> None:
        """Keep the newest ``keep`` committed checkpoints; drop interrupted saves."""
        committed = self.checkpoints()
        keep_seqs = {c.sequence for c in committed[: self.keep]} | {newest}
        stale = []
        for name in os.listdir(self.directory):
            m = NAME_RE.match(name)
            if (m is not None and int(m["seq"]) not in keep_seqs) or (
                name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)
            ):
                stale.append(name)
        # Manifests before data files: a crash in between must never leave a
        # committed manifest whose data file is gone.
        stale.sort(key=lambda n: not n.endswith(".json"))
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / name)
        if stale:
            fsync_dir(self.directory)

    # ----------------------------------------------------------------- loading

    def load(
        self,
        *,
        model: SupportsStateDict | None = None,
        optimizer: SupportsStateDict | None = None,
        scheduler: SupportsStateDict | None = None,
        scaler: SupportsStateDict | None = None,
        rng: bool = True,
        strict: bool = True,
        map_location: Any = "cpu",
    ) -> int | None:
        """Restore the newest loadable checkpoint into the given objects.

        Returns the step it was saved at, or ``None`` when the directory holds
        no checkpoint (a fresh start). A corrupt, truncated or refused newest
        checkpoint is skipped with a :class:`CheckpointWarning` and an older
        one used. Raises :class:`~trainmedic.errors.CheckpointError` when
        checkpoints exist but none can be loaded, or when the one loaded lacks
        a state that was asked for or does not fit the model.

        ``strict`` is passed to ``model.load_state_dict``; ``map_location`` to
        ``torch.load`` (CPU by default: ``load_state_dict`` copies to the
        parameters' devices).
        """
        candidates = self.checkpoints()
        if not candidates:
            return None
        with phase("checkpoint"):
            return self._load_newest(
                candidates, model, optimizer, scheduler, scaler, rng, strict, map_location
            )

    def _load_newest(
        self,
        candidates: list[CheckpointInfo],
        model: SupportsStateDict | None,
        optimizer: SupportsStateDict | None,
        scheduler: SupportsStateDict | None,
        scaler: SupportsStateDict | None,
        rng: bool,
        strict: bool,
        map_location: Any,
    ) -> int:
        problems: list[tuple[str, str]] = []
        for info in candidates:
            try:
                payload = read_verified(info, map_location)
            except Unusable as e:
                problems.append((info.data.name, str(e)))
                continue
            for name, problem in problems:
                warnings.warn(
                    f"checkpoint {self.directory / name} skipped: {problem}; "
                    f"resuming from {info.data.name} (step {info.step})",
                    CheckpointWarning,
                    stacklevel=3,
                )
            restore(payload, info, model, optimizer, scheduler, scaler, rng, strict)
            self.resumed = LoadedCheckpoint(
                step=info.step,
                sequence=info.sequence,
                path=info.data,
                extra=payload["extra"],
                skipped=tuple(problems),
            )
            self._last_save_step = info.step
            _report_resumed(self.resumed)
            return info.step
        listing = "; ".join(f"{name}: {problem}" for name, problem in problems)
        raise CheckpointError(
            f"no loadable checkpoint in {self.directory} ({len(problems)} tried): {listing}",
            directory=str(self.directory),
            problems=tuple(problems),
        )


# --------------------------------------------------------------------- helpers


def _report_resumed(loaded: LoadedCheckpoint) -> None:
    """Tell the supervisor of ``trainmedic run`` (when there is one) where the job
    resumed: restart accounting counts the steps it redoes from there."""
    from trainmedic.api import _probe

    probe = _probe()
    if probe is None:
        return
    with contextlib.suppress(Exception):  # a report must never fail a resume
        from trainmedic.record.types import RunEvent

        probe.emit(
            RunEvent(
                t=time.time(),
                kind=EventKind.CHECKPOINT_RESUMED,
                message=f"resumed from {loaded.path.name} (step {loaded.step})",
                pid=os.getpid(),
                data={"step": loaded.step, "path": str(loaded.path)},
            )
        )


def _is_nonzero_rank() -> bool:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)
    except (RuntimeError, ValueError):
        return False
