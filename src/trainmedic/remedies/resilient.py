"""Resilient data: retry transient read errors and slow reads, skip persistently bad samples.

:class:`ResilientDataset` wraps a map-style dataset. Reading sample ``i``:

- a *transient* error (``TimeoutError``, ``ConnectionError``, most ``OSError``
  such as ``EIO``/``ESTALE`` of a network filesystem; see :func:`is_transient`)
  is retried with exponential backoff and jitter (tenacity), up to ``retries``
  times; a read slower than ``timeout_s`` counts as a transient error (the
  slow call is abandoned in its daemon thread);
- a *persistent* error (a corrupt file that fails to decode, a missing file),
  or a transient one that outlasts the retries, marks the sample bad: it is
  logged and skipped — the next good sample takes its place, so batches keep
  their size — up to ``max_skips`` bad samples, after which
  :class:`TooManyBadSamples` ends the run with a message naming them.

Every retry and skip goes to the ``trainmedic.remedies`` logger and, under
``trainmedic run``, to the run record (``sample_retried`` / ``sample_skipped``
events). It works inside DataLoader workers (it pickles; each worker keeps its
own list of bad samples, and ``skip_log`` — a JSON-lines file — makes the cap
count the bad samples of every process).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import tenacity

from trainmedic.errors import TrainmedicError
from trainmedic.record.events import EventKind
from trainmedic.remedies.events import report_event
from trainmedic.remedies.wrapper import DatasetWrapper

LOG = logging.getLogger("trainmedic.remedies")

_PERSISTENT_ERRNOS = frozenset(
    {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EINVAL}
)


class TooManyBadSamples(TrainmedicError):
    """More samples failed than the cap allows: the data, not a sample, is broken."""


class SampleTimeout(TimeoutError):
    """A sample took longer than the per-sample timeout to read."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` may go away on a retry: timeouts, connection errors, I/O errors
    other than a missing or unreadable file."""
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno not in _PERSISTENT_ERRNOS
    name = type(exc).__name__
    # http.client and urllib3/requests errors of a dropped transfer
    return name in {"IncompleteRead", "RemoteDisconnected", "ProtocolError", "ReadTimeout"}


def _describe_default(dataset: Any, index: int) -> str:
    samples = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
    try:
        entry = samples[index] if samples is not None else None
    except Exception:
        entry = None
    if isinstance(entry, (tuple, list)) and entry and isinstance(entry[0], str):
        return f"index {index} ({entry[0]})"
    if isinstance(entry, str):
        return f"index {index} ({entry})"
    return f"index {index}"


class ResilientDataset(DatasetWrapper):
    """A map-style dataset whose reads survive flaky storage and bad samples.

    Args:
        dataset: the dataset to wrap (``__getitem__`` and ``__len__``).
        retries: retries of a transient error (attempts = retries + 1).
        timeout_s: a read slower than this is abandoned and retried (``None``: no limit).
        backoff_s / max_backoff_s: first wait and the longest, seconds; doubling,
            plus up to ``backoff_s`` of random jitter.
        max_skips: bad samples allowed before :class:`TooManyBadSamples`;
            default: max(10, 0.1 % of the dataset).
        skip_log: JSON-lines file of bad samples, appended by every process.
        describe: ``(index) -> str`` naming a sample in logs (default: the file
            path of ``dataset.samples[index]`` when there is one).
        transient: ``exc -> bool``, which errors to retry (:func:`is_transient`).
        sleep: the wait between retries (tests pass a recorder).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        retries: int = 3,
        timeout_s: float | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_skips: int | None = None,
        skip_log: str | os.PathLike[str] | None = None,
        describe: Callable[[int], str] | None = None,
        transient: Callable[[BaseException], bool] = is_transient,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.dataset = dataset
        self.retries = retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        n = len(dataset)
        self.max_skips = max(10, math.ceil(0.001 * n)) if max_skips is None else max_skips
        self.skip_log = None if skip_log is None else os.fspath(skip_log)
        self.describe = describe
        self.transient = transient
        self.sleep = sleep
        self.bad: dict[int, str] = {}
        """Bad samples of this process: index -> the error."""
        self.retried = 0
        """Retries of this process that ended in a good read."""

    def __getitem__(self, index: int) -> Any:
        n = len(self.dataset)
        for offset in range(n):
            i = (index + offset) % n
            if i in self.bad:
                continue
            try:
                return self._read(i)
            except TooManyBadSamples:
                raise
            except Exception as exc:
                self._mark_bad(i, exc)
        raise TooManyBadSamples("every sample of the dataset failed to load")

    # --- one sample ---------------------------------------------------------------------------

    def _name(self, index: int) -> str:
        if self.describe is not None:
            try:
                return self.describe(index)
            except Exception:
                return f"index {index}"
        return _describe_default(self.dataset, index)

    def _read(self, index: int) -> Any:
        attempts: list[str] = []

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            attempts.append(f"{type(exc).__name__}: {exc}")
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            LOG.warning(
                "retrying %s after %s (attempt %d of %d, waiting %.2f s)",
                self._name(index),
                attempts[-1],
                state.attempt_number,
                self.retries + 1,
                wait,
            )

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)
            + tenacity.wait_random(0, self.backoff_s),
            retry=tenacity.retry_if_exception(self.transient),
            before_sleep=before_sleep,
            sleep=self.sleep,
            reraise=True,
        )
        value = retrying(self._read_once, index)
        if attempts:
            self.retried += 1
            report_event(
                EventKind.SAMPLE_RETRIED,
                f"{self._name(index)} loaded after {len(attempts)} retr"
                f"{'y' if len(attempts) == 1 else 'ies'} ({attempts[-1]})",
                {"index": index, "retries": len(attempts), "errors": attempts[-3:]},
            )
        return value

    def _read_once(self, index: int) -> Any:
        if self.timeout_s is None:
            return self.dataset[index]
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = self.dataset[index]
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        # A daemon thread, not a pool: a read hung for good must not hold up the
        # process's exit (pool threads are joined at exit).
        threading.Thread(target=target, name="trainmedic-read", daemon=True).start()
        if not done.wait(self.timeout_s):
            raise SampleTimeout(f"read took longer than {self.timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    # --- bad samples --------------------------------------------------------------------------

    def _mark_bad(self, index: int, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.bad[index] = error
        name = self._name(index)
        total = self._log_skip(index, name, error)
        LOG.error(
            "skipping %s: %s (%d of at most %d bad samples)", name, error, total, self.max_skips
        )
        report_event(
            EventKind.SAMPLE_SKIPPED,
            f"skipped {name}: {error}",
            {"index": index, "sample": name, "error": error, "bad_samples": total},
        )
        if total > self.max_skips:
            shown = ", ".join(self._name(i) for i in list(self.bad)[-3:])
            raise TooManyBadSamples(
                f"{total} samples failed to load, more than max_skips={self.max_skips} "
                f"(latest: {shown}; last error: {error}): the data set or its storage is "
                "broken, not a sample"
            )

    def _log_skip(self, index: int, name: str, error: str) -> int:
        """Append to the skip log; returns the bad samples counted so far (all processes)."""
        if self.skip_log is None:
            return len(self.bad)
        line = json.dumps(
            {"t": time.time(), "pid": os.getpid(), "index": index, "sample": name, "error": error}
        )
        # O_APPEND writes of one short line land whole, whichever process writes.
        fd = os.open(self.skip_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        seen: set[int] = set()
        with open(self.skip_log, encoding="utf-8") as f:
            for raw in f:
                try:
                    seen.add(int(json.loads(raw)["index"]))
                except (ValueError, KeyError, TypeError):
                    continue
        return len(seen)
