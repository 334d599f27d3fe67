"""``run --apply-from``, inside the job: apply the plan when the script builds its DataLoaders.

The supervisor puts the plan (:class:`trainmedic.remedies.apply.plan.ApplyPlan`)
in ``TRAINMEDIC_APPLY``; :func:`install` runs right after the job imports
torch, next to the probe's own hooks, and

* wraps ``DataLoader.__init__``: for a map-style dataset of a planned type, it
  raises ``num_workers`` and ``prefetch_factor`` to the plan's (never lowers
  what the script chose), pins memory when CUDA is present, and wraps the
  dataset in :class:`~trainmedic.remedies.threaded.ThreadedFetch` when the plan
  has fetch threads. Iterable datasets are left alone: extra workers would each
  yield the whole dataset unless it shards itself.
* wraps ``DataLoader._get_iterator``: before the first iteration of a changed
  loader, a throw-away loader with the same dataset, workers and start method
  fetches one batch. When that fails — an unpicklable dataset under
  spawn/forkserver, workers that die at start or time out — the loader gets the
  script's own settings back, and the run record says why. The global random
  state is restored afterwards, so the script's random stream is unchanged.
* turns on the planned torch switches (:mod:`trainmedic.remedies.apply.switches`):
  TF32 matmuls at once, ``cudnn.benchmark`` once the first DataLoader batches
  show fixed shapes.

Every change, refusal and fallback becomes a ``remedy_applied``,
``remedy_not_applied`` or ``remedy_reverted`` event of the run record. An
error of this module disables it and is reported; the job goes on with its
own settings.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from trainmedic.codehash import code_of
from trainmedic.record.events import EventKind

if TYPE_CHECKING:
    from trainmedic.probe.seams import ProbeSeam

APPLY_ENV = "TRAINMEDIC_APPLY"  # trainmedic.remedies.apply.plan.APPLY_ENV (no import at start-up)
PREFLIGHT_TIMEOUT_S = 120
"""A preflight worker that has not delivered its batch by then counts as failed."""
SHAPE_CHECK_BATCHES = 20  # trainmedic.remedies.apply.switches.SHAPE_CHECK_CALLS


def install(torch: Any, probe: ProbeSeam) -> Applier | None:
    """Apply ``TRAINMEDIC_APPLY`` in this process; ``None`` when there is no plan."""
    raw = os.environ.get(APPLY_ENV)
    if not raw or probe.role == "worker":
        return None
    try:
        plan = json.loads(raw)
        if not isinstance(plan, dict):
            raise ValueError(f"{APPLY_ENV} is not a JSON object")
    except ValueError as exc:
        applier = Applier(torch, probe, {})
        applier.fail(exc)
        return None
    applier = Applier(torch, probe, plan)
    try:
        applier.install()
    except Exception as exc:
        applier.fail(exc)
    return applier


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _shapes(value: Any, depth: int = 0) -> tuple[Any, ...]:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return (tuple(value.shape),)
    if depth > 4:
        return ()
    if isinstance(value, dict):
        return tuple(s for v in value.values() for s in _shapes(v, depth + 1))
    if isinstance(value, (list, tuple)):
        return tuple(s for v in value[:16] for s in _shapes(v, depth + 1))
    return ()


class _Changed:
    """A loader this module changed: its id, the script's settings, ours."""

    __slots__ = ("loader_id", "original", "verified", "wrapped_dataset")

    def __init__(self, loader_id: int, original: dict[str, Any], wrapped_dataset: Any) -> None:
        self.loader_id = loader_id
        self.original = original
        self.wrapped_dataset = wrapped_dataset
        self.verified = False


class Applier:
    """The plan in one process."""

    def __init__(self, torch: Any, probe: ProbeSeam, plan: dict[str, Any]) -> None:
        self.torch = torch
        self.probe = probe
        self.plan = plan
        self.loader_plan: dict[str, Any] = dict(plan.get("dataloader") or {})
        self.switches: dict[str, bool] = dict(plan.get("switches") or {})
        self.types = frozenset(plan.get("dataset_types") or ())
        self.codes = frozenset(plan.get("dataset_codes") or ())
        self.reasons: dict[str, str] = dict(plan.get("reasons") or {})
        self.on = True
        self.changed: weakref.WeakKeyDictionary[Any, _Changed] = weakref.WeakKeyDictionary()
        self.count = 0
        self._local = threading.local()
        self._shapes: list[tuple[Any, ...]] = []
        self._switch_state: dict[str, Any] = {}
        # Switch events wait until the process shows it trains (a DataLoader batch on
        # its training thread, or a normal exit): spawned DataLoader workers import
        # torch too, and must not report the switches once each.
        self._pending: list[tuple[EventKind, str, dict[str, Any]]] = []

    # --- reporting --------------------------------------------------------------------------------

    def event(self, kind: EventKind, message: str, data: dict[str, Any]) -> None:
        data = {"source": self.plan.get("source"), **data}
        self.probe.emit(self.probe.event(kind, message, data))

    def fail(self, exc: BaseException) -> None:
        if not self.on:
            return
        self.on = False
        self.event(
            EventKind.PROBE_ERROR,
            f"--apply-from disabled after an internal error: {type(exc).__name__}: {exc}",
            {"part": "apply", "error": f"{type(exc).__name__}: {exc}"},
        )

    # --- installation ---------------------------------------------------------------------------

    def install(self) -> None:
        if self.loader_plan:
            self._wrap_loader()
        if self.switches:
            self._apply_switches_now()
            atexit.register(self.report_switches)

    def _wrap_loader(self) -> None:
        loader_cls = self.torch.utils.data.DataLoader
        original_init = loader_cls.__init__
        original_get = loader_cls._get_iterator
        signature = inspect.signature(original_init)
        applier = self

        @functools.wraps(original_init)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            if not applier.on or getattr(applier._local, "busy", False):
                original_init(loader, *args, **kwargs)
                return
            try:
                bound = signature.bind(loader, *args, **kwargs)
                bound.apply_defaults()
                new = applier._decide(bound.arguments)
            except Exception as exc:
                applier.fail(exc)
                new = {}
            if not new:
                original_init(loader, *args, **kwargs)
                return
            original = {k: bound.arguments[k] for k in new}
            bound.arguments.update(new)
            try:
                original_init(*bound.args, **bound.kwargs)
            except Exception as exc:
                applier._refused(bound.arguments["dataset"], original, new, exc)
                original_init(loader, *args, **kwargs)
                return
            try:
                applier._applied(loader, original, new)
            except Exception as exc:  # the loader is built; only the record of it failed
                applier.fail(exc)

        @functools.wraps(original_get)
        def _get_iterator(loader: Any) -> Any:
            entry = applier.changed.get(loader) if applier.on else None
            if entry is not None and not entry.verified:
                entry.verified = True
                try:
                    applier._preflight(loader, entry, original_get)
                except Exception as exc:
                    applier.fail(exc)
            return original_get(loader)

        loader_cls.__init__ = __init__
        loader_cls._get_iterator = _get_iterator
        self.probe.restore.append(lambda: setattr(loader_cls, "__init__", original_init))
        self.probe.restore.append(lambda: setattr(loader_cls, "_get_iterator", original_get))

    # --- loaders --------------------------------------------------------------------------------

    def _decide(self, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments to change for a loader built with ``args`` (``{}``: none)."""
        data = self.torch.utils.data
        dataset = args["dataset"]
        if isinstance(dataset, data.IterableDataset):
            self._not_applied(
                dataset,
                "an iterable dataset: each extra worker would yield all of it unless it "
                "shards itself (torch.utils.data.get_worker_info)",
            )
            return {}
        if self.types and _type_name(dataset) not in self.types:
            return {}  # another dataset than the one measured (an evaluation set, say)
        if self.codes and code_of(dataset) not in self.codes:
            self._not_applied(
                dataset,
                f"{_type_name(dataset)} here is defined by other code than the dataset "
                "tuned (a class of the same name in another file)",
            )
            return {}
        plan = self.loader_plan
        new: dict[str, Any] = {}
        workers = int(args.get("num_workers") or 0)
        want = int(plan.get("num_workers") or 0)
        if want > workers:
            new["num_workers"] = want
            workers = want
        if workers > 0 and plan.get("prefetch_factor"):
            current = args.get("prefetch_factor") or 2
            if int(plan["prefetch_factor"]) > current:
                new["prefetch_factor"] = int(plan["prefetch_factor"])
        pin = plan.get("pin_memory") and not args.get("pin_memory")
        if pin and self.torch.cuda.is_available():
            new["pin_memory"] = True
        threads = int(plan.get("threads") or 1)
        if threads > 1:
            from trainmedic.remedies.threaded import ThreadedFetch

            if not isinstance(dataset, ThreadedFetch):
                new["dataset"] = ThreadedFetch(dataset, threads)
        return new

    def _settings(self, new: dict[str, Any]) -> dict[str, Any]:
        """Loader arguments as the run record shows them (a dataset by its type)."""
        from trainmedic.remedies.threaded import ThreadedFetch

        def shown(key: str, value: Any) -> Any:
            if key != "dataset":
                return value
            if isinstance(value, ThreadedFetch):
                return f"ThreadedFetch(threads={value.threads})"
            return _type_name(value)

        return {k: shown(k, v) for k, v in new.items()}

    def _applied(self, loader: Any, original: dict[str, Any], new: dict[str, Any]) -> None:
        self.count += 1
        entry = _Changed(self.count, original, new.get("dataset"))
        self.changed[loader] = entry
        shown_old = self._settings(original)
        changed = {k: [shown_old[k], v] for k, v in self._settings(new).items()}
        self.event(
            EventKind.REMEDY_APPLIED,
            "DataLoader "
            + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
            + " (--apply-from)",
            {
                "remedy": "dataloader",
                "loader": entry.loader_id,
                "dataset_type": _type_name(original.get("dataset", loader.dataset)),
                "changed": changed,
                "reasons": {k: self.reasons.get(k, "") for k in new if k != "dataset"},
            },
        )

    def _refused(
        self, dataset: Any, original: dict[str, Any], new: dict[str, Any], exc: Exception
    ) -> None:
        self.event(
            EventKind.REMEDY_REVERTED,
            f"DataLoader kept the script's settings: it refused ours ({type(exc).__name__}: {exc})",
            {
                "remedy": "dataloader",
                "dataset_type": _type_name(dataset),
                "reason": f"{type(exc).__name__}: {exc}",
                "restored": self._settings(original),
            },
        )

    def _not_applied(self, dataset: Any, reason: str) -> None:
        self.event(
            EventKind.REMEDY_NOT_APPLIED,
            f"DataLoader over {_type_name(dataset)} left as it is: {reason}",
            {"remedy": "dataloader", "dataset_type": _type_name(dataset), "reason": reason},
        )

    def _preflight(self, loader: Any, entry: _Changed, original_get: Any) -> None:
        """Fetch one batch with the new settings in a throw-away loader; revert on failure."""
        if loader.num_workers == 0:
            return
        torch = self.torch
        rng = torch.random.get_rng_state()
        generator = getattr(loader, "generator", None)
        gen_state = generator.get_state() if generator is not None else None
        self._local.busy = True
        iterator = None
        error: str | None = None
        try:
            dataset = loader.dataset
            kwargs: dict[str, Any] = {
                "num_workers": loader.num_workers,
                "collate_fn": loader.collate_fn,
                "worker_init_fn": loader.worker_init_fn,
                "multiprocessing_context": loader.multiprocessing_context,
                "prefetch_factor": loader.prefetch_factor,
                "timeout": PREFLIGHT_TIMEOUT_S,
            }
            if loader._auto_collation:
                size = max(1, min(len(dataset), loader.batch_size or 1))
                kwargs["batch_sampler"] = [list(range(size))]
            else:
                kwargs["sampler"] = [0]
                kwargs["batch_size"] = None
            trial = torch.utils.data.DataLoader(dataset, **kwargs)
            iterator = original_get(trial)  # not iter(): the probe must not count this loader
            iterator._next_data()
        except Exception as exc:
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        finally:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                with contextlib.suppress(Exception):
                    shutdown()
            del iterator
            self._local.busy = False
            torch.random.set_rng_state(rng)
            if generator is not None and gen_state is not None:
                generator.set_state(gen_state)
        if error is not None:
            self._revert(loader, entry, error)

    def _revert(self, loader: Any, entry: _Changed, error: str) -> None:
        restored: dict[str, Any] = {}
        for key, value in entry.original.items():
            # DataLoader forbids setting some attributes after __init__; going
            # around it restores exactly what the script built.
            object.__setattr__(loader, key, value)
            restored[key] = value
        if loader.num_workers == 0:
            object.__setattr__(loader, "prefetch_factor", None)
        shown = {k: v for k, v in restored.items() if k != "dataset"}
        if "dataset" in restored:
            shown["dataset"] = _type_name(restored["dataset"])
        self.event(
            EventKind.REMEDY_REVERTED,
            f"DataLoader {entry.loader_id} back to the script's settings: workers could not "
            f"start with ours ({error})",
            {
                "remedy": "dataloader",
                "loader": entry.loader_id,
                "reason": error,
                "restored": shown,
            },
        )

    # --- torch switches ---------------------------------------------------------------------------

    def _facts(self) -> Any:
        from trainmedic.remedies.apply.switches import RuntimeFacts

        torch = self.torch
        cudnn = torch.backends.cudnn
        deterministic = bool(getattr(cudnn, "deterministic", False))
        with_alg = getattr(torch, "are_deterministic_algorithms_enabled", None)
        if with_alg is not None:
            deterministic = deterministic or bool(with_alg())
        shapes_fixed = None
        if len(self._shapes) >= SHAPE_CHECK_BATCHES:
            shapes_fixed = len(set(self._shapes)) == 1
        return RuntimeFacts(
            cuda_build=bool(getattr(torch.version, "cuda", None)),
            matmul_precision=str(torch.get_float32_matmul_precision()),
            cudnn_benchmark=bool(cudnn.benchmark),
            deterministic=deterministic,
            shapes_fixed=shapes_fixed,
        )

    def _apply_switches_now(self) -> None:
        from trainmedic.remedies.apply.switches import runtime_decision

        for switch in self.switches:
            decision, why = runtime_decision(switch, self._facts())
            if decision is None:
                self._watch_shapes()
            else:
                self._switch(switch, decision, why)

    def _switch(self, switch: str, on: bool, why: str) -> None:
        torch = self.torch
        if not on:
            self._switch_state[switch] = None
            self._pending.append(
                (
                    EventKind.REMEDY_NOT_APPLIED,
                    f"{switch} not applied: {why}",
                    {"remedy": switch, "reason": why},
                )
            )
            return
        if switch == "tf32_matmul":
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("high")
            changed = {"float32_matmul_precision": [before, "high"]}
        else:
            torch.backends.cudnn.benchmark = True
            changed = {"cudnn.benchmark": [False, True]}
        self._switch_state[switch] = True
        self._pending.append(
            (
                EventKind.REMEDY_APPLIED,
                f"{switch}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
                {"remedy": switch, "changed": changed, "reason": why},
            )
        )

    def _flush_switches(self) -> None:
        pending, self._pending = self._pending, []
        for kind, message, data in pending:
            self.event(kind, message, data)

    def _watch_shapes(self) -> None:
        iter_cls = self.torch.utils.data.dataloader._BaseDataLoaderIter
        previous = iter_cls.__next__
        applier = self

        @functools.wraps(previous)
        def __next__(iterator: Any) -> Any:
            batch = previous(iterator)
            try:
                if applier.on and threading.get_ident() == applier.probe.state.training_ident:
                    applier._flush_switches()
                    applier._shapes.append(_shapes(batch))
                    if len(applier._shapes) >= SHAPE_CHECK_BATCHES:
                        applier._decide_benchmark()
                        if iter_cls.__next__ is __next__:
                            iter_cls.__next__ = previous
            except Exception as exc:
                applier.fail(exc)
            return batch

        iter_cls.__next__ = __next__
        self.probe.restore.append(
            lambda: (
                setattr(iter_cls, "__next__", previous) if iter_cls.__next__ is __next__ else None
            )
        )

    def _decide_benchmark(self) -> None:
        from trainmedic.remedies.apply.switches import runtime_decision

        if "cudnn_benchmark" in self._switch_state:
            return
        decision, why = runtime_decision("cudnn_benchmark", self._facts())
        self._switch("cudnn_benchmark", bool(decision), why)
        self._flush_switches()

    def report_switches(self) -> None:
        """Report the switches (at exit: DataLoader workers never get here)."""
        if not self.on:
            return
        try:
            self._flush_switches()
            torch = self.torch
            if self._switch_state.get("tf32_matmul") and (
                torch.get_float32_matmul_precision() != "high"
            ):
                self.event(
                    EventKind.REMEDY_OVERRIDDEN,
                    "tf32_matmul: the script set float32 matmul precision back to "
                    f"{torch.get_float32_matmul_precision()!r}",
                    {"remedy": "tf32_matmul"},
                )
            if "cudnn_benchmark" in self.switches and "cudnn_benchmark" not in self._switch_state:
                self.event(
                    EventKind.REMEDY_NOT_APPLIED,
                    f"cudnn_benchmark not applied: fewer than {SHAPE_CHECK_BATCHES} DataLoader "
                    "batches to check the input shapes",
                    {"remedy": "cudnn_benchmark", "reason": "too few batches seen"},
                )
        except Exception:
            pass
