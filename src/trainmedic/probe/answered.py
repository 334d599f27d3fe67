"""Whether a wait on another thread has already been answered.

The stack sampler needs the interpreter lock to read stacks. A helper that
computes in Python holds it, and lets go when it hands the batch over (sets
the future, puts the item) and goes back to waiting for work - a moment
after which the sampler, waiting for the lock, often runs first. The
training thread's stack then still shows the wait (it too waits for the lock
to return from it), though what it waited for is there. The helper that
answered has just gone idle: its state says nothing of what the wait was
spent on. In such a sample only the helpers still working count (a pool's
other threads computing the next futures the loop will wait on); when none
is, the sample counts as a wait whose helpers were not looked at
(:data:`~trainmedic.record.sample_states.DELIVERED`). Without that, a loop
waiting on an event loop that computes each batch in less than the
interpreter's switch interval (5 ms) reads as waiting on helpers that are
mostly idle.

The answered waits recognised are the ones whose object says so without a
system call: a ``concurrent.futures.Future`` done (``result()``,
``exception()``, what ``asyncio.run_coroutine_threadsafe`` returns), a
``queue.Queue`` holding an item, a ``threading.Event`` set. Reading them
costs a few µs, and only in samples that wait on others.
"""

from __future__ import annotations

from collections import Counter
from types import FrameType

from trainmedic.record.sample_states import BUSY_HELPER_STATES, PROCESS_PREFIX, THREAD_PREFIX

MAX_DEPTH = 6
"""Frames looked at from the innermost outwards."""
_DONE = frozenset({"FINISHED", "CANCELLED", "CANCELLED_AND_NOTIFIED"})


def wait_answered(frame: FrameType | None) -> bool:
    """Whether the wait the stack ending in ``frame`` shows is already answered."""
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        answered = _answered(frame)
        if answered is not None:
            return answered
        frame = frame.f_back
        depth += 1
    return False


def _answered(frame: FrameType) -> bool | None:
    """``True``/``False`` when ``frame`` is a wait this module knows, else ``None``."""
    code = frame.f_code
    path = code.co_filename
    name = code.co_name
    if path.endswith("/concurrent/futures/_base.py") and name in ("result", "exception"):
        return getattr(_self(frame), "_state", None) in _DONE
    if path.endswith("/queue.py") and name == "get":
        qsize = getattr(_self(frame), "_qsize", None)
        try:
            return bool(callable(qsize) and qsize() > 0)
        except Exception:  # a subclass's _qsize may do anything; then it is not known
            return False
    if path.endswith("/threading.py") and name == "wait":
        owner = _self(frame)
        flag = getattr(owner, "_flag", None)
        if isinstance(flag, bool):  # an Event; a Condition's waiter is answered above it
            return flag
    return None


def _self(frame: FrameType) -> object:
    """The ``self`` of a method's frame (``None`` when there is none)."""
    code = frame.f_code
    if not code.co_varnames or code.co_varnames[0] != "self":
        return None
    return frame.f_locals.get("self")


_STATE_PREFIXES = (THREAD_PREFIX, PROCESS_PREFIX)
_BUSY = frozenset(BUSY_HELPER_STATES)


def still_working(observations: Counter[str]) -> Counter[str]:
    """The observations of one answered moment less its helpers that were not working
    (empty when none was: the moment tells nothing of the helpers)."""
    def idle(key: str) -> bool:
        prefix = next((p for p in _STATE_PREFIXES if key.startswith(p)), None)
        return prefix is not None and key[len(prefix):] not in _BUSY

    kept = Counter({k: n for k, n in observations.items() if not idle(k)})
    if not any(k.startswith(_STATE_PREFIXES) for k in kept):
        return Counter()
    return kept
