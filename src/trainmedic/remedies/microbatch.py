"""Automatic micro-batching: an out-of-memory error on a batch becomes gradient accumulation.

:class:`MicroBatchStep` runs one training step: zero the gradients, forward
and backward (in micro-batches when needed), optimizer step. When a batch
runs out of memory (CUDA or host, :func:`~trainmedic.remedies.oom.is_oom`),
what the failed attempt held is freed, the micro-batch is halved and the step
is redone from zeroed gradients. Each micro-batch's loss is weighted by its
share of the batch (``reduction="mean"``) or not at all (``"sum"``), so the
accumulated gradient equals the full batch's (layers whose output depends on
the other samples of the batch, such as BatchNorm in training mode, are the
exception). The working size is remembered; after ``grow_after`` good steps
it is doubled again, and a growth that fails doubles the stretch before the
next try.

Distributed (DDP): the ranks move in lockstep. Every micro-batch runs under
``no_sync()``, and after each one every rank votes with one tiny
``all_reduce``: if any rank ran out of memory, all ranks stop at that same
micro-batch and redo the step with the same, smallest proposed size, so no
rank waits in a collective the others never join (DDP's own forward
collectives, such as buffer broadcasts, happen the same number of times on
every rank). Once all micro-batches fitted everywhere, the gradients are
averaged across ranks once — summed in flattened buckets and divided by the
world size, which is what DDP's backward would have computed; its overlap of
that communication with the backward is given up for the guarantee. Running
out of memory while averaging raises :class:`MicroBatchError`, so that
``trainmedic run`` restarts the job with ``TRAINMEDIC_MICRO_BATCH_DIVISOR``
doubled, which this class reads: it starts at the divided size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.errors import TrainmedicError, UsageError
from trainmedic.record.events import EventKind
from trainmedic.remedies.batches import batch_size, split
from trainmedic.remedies.events import report_event
from trainmedic.remedies.oom import free_memory, is_oom
from trainmedic.remedy_api import micro_batch_divisor

DEFAULT_GROW_AFTER = 200
"""Good steps at a reduced size before the micro-batch is doubled again."""
MAX_GROW_AFTER = 100_000
BUCKET_BYTES = 16 * 2**20
"""Gradients are averaged across ranks in flattened buckets of about this size."""


class MicroBatchError(TrainmedicError):
    """Out of memory where micro-batching cannot help: at one sample, or in the
    synchronised backward of a distributed step."""


@dataclass(frozen=True)
class StepOutcome:
    """One attempt at a batch.

    Attributes:
        batch_size: samples in the batch.
        micro_batch_size: samples per forward/backward pass tried.
        ok: the attempt completed (``False``: out of memory on some rank).
    """

    batch_size: int
    micro_batch_size: int
    ok: bool


class MicroBatchStep:
    """A training step that splits its batch into micro-batches when memory runs out.

    ::

        step = trainmedic.MicroBatchStep(lambda b: criterion(model(b[0]), b[1]), optimizer)
        for batch in loader:
            loss = step(batch)

    Args:
        loss_fn: forward and loss of one (micro-)batch; returns a scalar tensor.
        optimizer: stepped after the gradients are complete (``None``: the caller
            steps; then ``model`` is required, to zero gradients).
        model: the model, or its ``DistributedDataParallel`` wrapper (whose
            ``no_sync`` is used).
        scaler: a ``torch.amp.GradScaler`` for fp16 training.
        reduction: ``"mean"`` when the loss averages over the batch (each
            micro-batch's loss is weighted by its share), ``"sum"`` when it sums.
        before_step: called when gradients are complete, before the optimizer
            step (after ``scaler.unscale_``): gradient clipping goes here.
        grow_after: good steps at a reduced size before trying double.
        sync_ranks: vote across ranks on every attempt; default: when
            ``torch.distributed`` is initialised with more than one rank.
        process_group: the group to vote in (default: the world).
        environ: where ``TRAINMEDIC_MICRO_BATCH_DIVISOR`` is read (``os.environ``).
        free: releases what a failed attempt held (default:
            :func:`~trainmedic.remedies.oom.free_memory`: a full garbage
            collection, then CUDA's cached blocks).
    """

    def __init__(
        self,
        loss_fn: Callable[[Any], Any],
        optimizer: Any | None,
        *,
        model: Any | None = None,
        scaler: Any | None = None,
        reduction: str = "mean",
        before_step: Callable[[], None] | None = None,
        grow_after: int = DEFAULT_GROW_AFTER,
        sync_ranks: bool | None = None,
        process_group: Any | None = None,
        environ: Mapping[str, str] | None = None,
        free: Callable[[], None] = free_memory,
    ) -> None:
        if reduction not in ("mean", "sum"):
            raise UsageError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if optimizer is None and model is None:
            raise UsageError("MicroBatchStep needs an optimizer or a model (to zero gradients)")
        if grow_after < 1:
            raise UsageError(f"grow_after must be >= 1, got {grow_after}")
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.model = model
        self.scaler = scaler
        self.reduction = reduction
        self.before_step = before_step
        self.grow_after = grow_after
        self._sync_ranks = sync_ranks
        self._group = process_group
        self._free = free
        self.divisor = micro_batch_divisor(environ)
        self.micro_batch_size: int | None = None
        """The working micro-batch size, ``None`` while whole batches fit."""
        self.good_steps = 0
        self.history: list[StepOutcome] = []
        """Every attempt, oldest first (the last 1,000)."""
        self._full_seen: int | None = None

    # --- the step ----------------------------------------------------------------------------

    def __call__(self, batch: Any) -> Any:
        """One optimizer step over ``batch``; returns the batch's loss (detached)."""
        n = batch_size(batch)
        if n is None:
            raise UsageError("MicroBatchStep: the batch holds no tensor to split along dim 0")
        if self.micro_batch_size is None and self.divisor > 1 and self._full_seen is None:
            self.micro_batch_size = max(1, n // self.divisor)
        self._full_seen = n
        if self._distributed():
            largest, neg_smallest = self._all_reduce_max([n, -n])
            if largest != -neg_smallest:
                raise MicroBatchError(
                    f"ranks have batches of {-neg_smallest} to {largest} samples: lockstep "
                    "micro-batching needs equal batches (DistributedSampler pads to them; "
                    "or drop_last=True)"
                )
        growing = self._maybe_grow(n)
        while True:
            micro = min(n, self.micro_batch_size or n)
            ok, loss = self._attempt(batch, n, micro)
            self._note(StepOutcome(n, micro, ok))
            if ok:
                break
            if micro <= 1:
                raise MicroBatchError(
                    "out of memory with a micro-batch of 1 sample: the model itself does not "
                    "fit; use mixed precision, a smaller model or activation checkpointing"
                )
            self.micro_batch_size = self._agree(max(1, micro // 2))
            self.good_steps = 0
            if growing:
                self.grow_after = min(MAX_GROW_AFTER, self.grow_after * 2)
                growing = False
            report_event(
                EventKind.MICRO_BATCH,
                f"out of memory at {micro} samples: micro-batches of {self.micro_batch_size}",
                {"batch_size": n, "failed": micro, "micro_batch_size": self.micro_batch_size},
            )
        self._optimizer_step()
        if self.micro_batch_size is not None:
            self.good_steps += 1
        return loss

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per step at the working size, for the last batch size seen."""
        n = self._full_seen or 1
        micro = min(n, self.micro_batch_size or n)
        return -(-n // micro)

    def _maybe_grow(self, n: int) -> bool:
        micro = self.micro_batch_size
        if micro is None or self.good_steps < self.grow_after:
            return False
        self.good_steps = 0
        grown = micro * 2
        self.micro_batch_size = None if grown >= n else grown
        report_event(
            EventKind.MICRO_BATCH,
            f"{self.grow_after} good steps: trying micro-batches of {min(grown, n)}",
            {"batch_size": n, "micro_batch_size": min(grown, n), "grow": True},
        )
        return True

    def _note(self, outcome: StepOutcome) -> None:
        self.history.append(outcome)
        if len(self.history) > 1000:
            del self.history[:-1000]

    def _attempt(self, batch: Any, n: int, micro: int) -> tuple[bool, Any]:
        """Forward/backward over the micro-batches; ``(False, None)`` after an OOM anywhere
        (on any rank, when distributed)."""
        parts = split(batch, micro)
        distributed = self._distributed()
        total: Any = 0.0
        self._zero_grad()
        for i, (part, rows) in enumerate(parts):
            weight = rows / n if self.reduction == "mean" else 1.0
            # Alone, the last part's backward reduces (DDP in a group of one); across
            # ranks every part runs without DDP's reduction, which happens once below,
            # after all ranks agreed that every part fitted.
            unsynced = distributed or i < len(parts) - 1
            loss: Any = None
            oom = False
            try:
                with self._no_sync() if unsynced else contextlib.nullcontext():
                    loss = self.loss_fn(part)
                    self._backward(loss * weight)
                total = total + loss.detach() * weight
            except Exception as exc:
                if not is_oom(exc):
                    raise
                oom = True
            loss = None  # the failed part's graph must go before memory is freed
            if distributed:
                oom = self._vote(oom)  # lockstep: every rank stops at the same part
            if oom:
                self._zero_grad()
                self._free()
                return False, None
        if distributed:
            try:
                self._reduce_gradients()
            except Exception as exc:
                if not is_oom(exc):
                    raise
                raise MicroBatchError(
                    "out of memory while averaging gradients across ranks; restart with a "
                    "smaller micro-batch (trainmedic run does: TRAINMEDIC_MICRO_BATCH_DIVISOR)"
                ) from None
        return True, total

    # --- the pieces the caller's objects provide -------------------------------------------------

    def _zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)  # type: ignore[union-attr]

    def _backward(self, loss: Any) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self) -> None:
        if self.scaler is not None and self.optimizer is not None:
            if self.before_step is not None:
                self.scaler.unscale_(self.optimizer)
                self.before_step()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return
        if self.before_step is not None:
            self.before_step()
        if self.optimizer is not None:
            self.optimizer.step()

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        no_sync = getattr(self.model, "no_sync", None)
        if no_sync is None:
            yield
        else:
            with no_sync():
                yield

    # --- agreement across ranks -----------------------------------------------------------------

    def _distributed(self) -> bool:
        if self._sync_ranks is not None:
            return self._sync_ranks
        import torch.distributed as dist

        return bool(
            dist.is_available() and dist.is_initialized() and dist.get_world_size(self._group) > 1
        )

    def _all_reduce_max(self, values: list[int]) -> list[int]:
        import torch
        import torch.distributed as dist

        device = "cpu"
        if dist.get_backend(self._group) == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        tensor = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)
        return [int(v) for v in tensor.tolist()]

    def _reduce_gradients(self) -> None:
        """Average gradients over the ranks, as DDP's backward would: summed in
        flattened buckets of about :data:`BUCKET_BYTES`, divided by the world size."""
        import torch
        import torch.distributed as dist

        if self.model is not None:
            params = list(self.model.parameters())
        else:
            assert self.optimizer is not None
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grads = []
        for p in params:
            if not p.requires_grad:
                continue
            if p.grad is None:  # unused here, maybe used on another rank: reduce zeros
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        # The same parameters in the same order on every rank: the same buckets.
        buckets: list[list[Any]] = []
        current: list[Any] = []
        size = 0
        for g in grads:
            if current and (
                g.dtype != current[0].dtype or g.device != current[0].device or size >= BUCKET_BYTES
            ):
                buckets.append(current)
                current, size = [], 0
            current.append(g)
            size += g.numel() * g.element_size()
        if current:
            buckets.append(current)
        world = dist.get_world_size(self._group)
        for bucket in buckets:
            flat = torch.cat([b.reshape(-1) for b in bucket])
            dist.all_reduce(flat, group=self._group)
            flat /= world
            offset = 0
            for b in bucket:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()

    def _vote(self, oom: bool) -> bool:
        """Whether any rank ran out of memory in this attempt (one collective per attempt)."""
        if not self._distributed():
            return oom
        return self._all_reduce_max([1 if oom else 0])[0] == 1

    def _agree(self, proposed: int) -> int:
        """The smallest size any rank proposes, so that every rank splits alike."""
        if not self._distributed():
            return proposed
        return -self._all_reduce_max([-proposed])[0]
