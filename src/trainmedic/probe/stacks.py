"""Where data-loading time goes, by sampling the stacks of the threads that load.

A sampler thread reads ``sys._current_frames()`` for the threads it is
pointed at (the training thread while it is blocked on a DataLoader, the
pin-memory thread, a DataLoader worker's main thread) and classifies each
stack into one state:

* ``transform`` - Python code (or a C extension it called) computing;
* ``file_read`` - reading files: ``open``/``read`` calls, image/array loaders;
* ``socket_wait`` - network I/O: sockets, HTTP clients, object stores;
* ``ipc_wait`` - the training thread waiting for worker processes;
* ``idle`` - a worker or the pin-memory thread waiting for work;
* ``other`` - sleeping, synchronising with the GPU, pinning memory.

Only Python frames are visible, so a C call made from Python (``f.read()``,
``cv2.imread``) leaves the caller as the innermost frame; the caller's
bytecode then tells which function it is calling
(:func:`trainmedic.probe.frames.callee_names`).
Classification is a pure function of the frames (:func:`classify`), tested on
its own; the sampler thread (:mod:`trainmedic.probe.sampling`) aggregates
counts (:class:`ActivityAggregate`) and sends a ``LoaderActivity`` every
:data:`FLUSH_S`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import FrameType

from trainmedic import frame_tables as tables
from trainmedic.probe.frames import CACHE_MAX, FrameInfo, callee_names, is_library
from trainmedic.record.sample_states import DELIVERED, WAIT_STATES, WAITS
from trainmedic.record.types import LoaderActivity

STATES = WAIT_STATES
FLUSH_S = 2.0
"""Seconds between two aggregates sent."""
MAX_FRAMES = 24
"""Frames read from the innermost outwards."""
TOP_FRAMES = 8
"""Most frequent frames kept per aggregate."""

# --- what a file path says -------------------------------------------------------------

# The socket, file, queue and delegating paths are tables.*, shared with host_states.py.

# (path part, functions) pairs: only these functions of the file read files.
_FILE_FUNCTIONS = (
    ("/PIL/Image.py", frozenset({"open", "_open_core"})),
    ("/PIL/ImageFile.py", frozenset({"__init__", "_open"})),
    ("/pathlib.py", frozenset({"open", "read_bytes", "read_text", "stat", "exists", "iterdir"})),
    ("/pathlib/", frozenset({"open", "read_bytes", "read_text", "stat", "exists", "iterdir"})),
    ("/os.py", frozenset({"walk", "fwalk", "_walk"})),
)
_PIN_PATH = "/torch/utils/data/_utils/pin_memory.py"
_WORKER_LOOP = "/torch/utils/data/_utils/worker.py"

# --- what a C call made from Python says ------------------------------------------------

_IPC_CALLS = frozenset({"recv_bytes", "recv_bytes_into", "poll"})
_OTHER_CALLS = frozenset(
    {"sleep", "item", "tolist", "cpu", "numpy", "synchronize", "wait_stream", "pin_memory"}
)


def short_name(filename: str) -> str:
    """The last two parts of a path (``PIL/Image.py``), enough to recognise a file."""
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:])


def frame_key(frames: Sequence[FrameInfo]) -> str:
    """``"file:line function"`` of the innermost frame, followed by the
    innermost frame of the script's own code when that is a different one."""
    if not frames:
        return "?"
    leaf = frames[0]
    key = f"{short_name(leaf.filename)}:{leaf.lineno} {leaf.function}"
    if is_library(leaf.filename):
        for f in frames[1:]:
            if not is_library(f.filename):
                key += f" < {short_name(f.filename)}:{f.lineno} {f.function}"
                break
    return key


def _path_state(frame: FrameInfo) -> str | None:
    """The state a frame's file decides, ``"ipc"`` for waits, ``"delegate"``, or ``None``."""
    path = frame.path
    if any(p in path for p in tables.SOCKET_PATHS):
        return "socket_wait"
    if any(p in path for p in tables.FILE_PATHS):
        return "file_read"
    for part, functions in _FILE_FUNCTIONS:
        if part in path and frame.function in functions:
            return "file_read"
    if any(p in path for p in tables.IPC_PATHS):
        return "ipc"
    if path.endswith(_PIN_PATH) and frame.function != "_pin_memory_loop":
        return "other"
    if any(path.endswith(p) for p in tables.DELEGATING_PATHS):
        return "delegate"
    return None


def _callee_state(callees: tuple[str, ...]) -> str | None:
    if not callees:
        return None
    last = callees[-1]
    if last in _OTHER_CALLS:
        return "other"
    if last in tables.SOCKET_CALLS or any(n in tables.SOCKET_NAMES for n in callees[:-1]):
        return "socket_wait"
    if last in tables.FILE_CALLS:
        return "file_read"
    if last in _IPC_CALLS:
        return "ipc"
    return None


def classify(frames: Sequence[FrameInfo], role: str) -> str:
    """The state of one stack, innermost frame first.

    Args:
        role: ``main`` (the training thread blocked on a DataLoader), ``self``
            (the training thread preparing a batch itself), ``pin`` (the
            pin-memory thread) or ``worker`` (a DataLoader worker's main thread).
    """
    state: str | None = None
    for i, frame in enumerate(frames):
        state = _path_state(frame)
        if state is None and i == 0:
            state = _callee_state(frame.callees)
        if state == "delegate":
            state = None
            continue
        if state is None:
            # Python code outside any known waiting or I/O library: it computes.
            state = "transform"
        break
    if state is None:
        return "other"
    if state == "ipc":
        # Waiting on a queue: a loading thread has nothing to do; the training
        # thread is waiting for the workers.
        return "idle" if role in ("worker", "pin") else "ipc_wait"
    return state


# --- reading live frames ------------------------------------------------------------------


def classify_for_role(frames: Sequence[FrameInfo], role: str) -> str:
    """:func:`classify`, except for the training thread between steps without a
    DataLoader (``role == "self"``): there the loop's own work is named (sleep,
    logging, syncs...) instead of all of it being called data preparation; and
    for a thread working for it (``role == "helper"``,
    :func:`trainmedic.probe.handoff.classify_helper`)."""
    if role == "self":
        from trainmedic.probe.host_states import classify_outside

        return classify_outside(frames)
    if role == "helper":
        from trainmedic.probe.handoff import classify_helper

        return classify_helper(frames)
    return classify(frames, role)


def hands_off(frames: Sequence[FrameInfo], role: str) -> bool:
    """Whether the training thread's stack (role ``self``) waits on another thread or
    process, whose work is then sampled too (:mod:`trainmedic.probe.handoff`)."""
    if role != "self":
        return False
    from trainmedic.probe.host_states import waits_on_others

    return waits_on_others(frames)


def read_frames(frame: FrameType | None, limit: int = MAX_FRAMES) -> list[FrameInfo]:
    """The stack from ``frame`` outwards, innermost first, at most ``limit`` frames."""
    out: list[FrameInfo] = []
    f = frame
    while f is not None and len(out) < limit:
        code = f.f_code
        callees = callee_names(code, f.f_lasti) if not out else ()
        out.append(FrameInfo(code.co_filename, f.f_lineno or 0, code.co_name, callees))
        f = f.f_back
    return out


# --- aggregates ------------------------------------------------------------------------------


def stack_signature(frame: FrameType | None, limit: int = MAX_FRAMES) -> tuple[object, ...]:
    """What identifies a live stack for classification: each frame's code and
    instruction, innermost first (cheap to build, unlike :func:`read_frames`)."""
    out: list[object] = []
    f = frame
    while f is not None and len(out) < 2 * limit:
        out.append(f.f_code)
        out.append(f.f_lasti)
        f = f.f_back
    return tuple(out)


class ActivityAggregate:
    """Counts of states and frames since the last flush; with what the threads and
    processes the training thread waited on did meanwhile (``handoff``,
    :mod:`trainmedic.probe.handoff`) and their most frequent frames."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.frames: Counter[str] = Counter()
        self.handoff: Counter[str] = Counter()
        self.helper_frames: Counter[str] = Counter()

    def add(self, frames: Sequence[FrameInfo], role: str) -> str:
        state = classify_for_role(frames, role)
        self.add_classified(state, frame_key(frames) if state != "idle" else "")
        return state

    def add_classified(self, state: str, key: str) -> None:
        """Count one stack already classified as ``state`` (``key``: its frame key)."""
        self.counts[state] += 1
        if state != "idle":
            self.frames[key] += 1

    def add_servers(self, observations: Counter[str]) -> None:
        """Observations of a data server a sampled thread waited on itself (no hand-off:
        ``waits`` is not counted)."""
        self.handoff.update(observations)

    def add_handoff(
        self, observations: Counter[str], keys: Counter[str], delivered: bool = False
    ) -> None:
        """Count one moment the training thread waited on others, and what they did;
        ``delivered``: its wait was already answered, the others not looked at
        (:data:`~trainmedic.record.sample_states.DELIVERED`)."""
        self.handoff[WAITS] += 1
        if delivered:
            self.handoff[DELIVERED] += 1
        self.handoff.update(observations)
        self.helper_frames.update(keys)

    def take(self, t: float, pid: int) -> LoaderActivity | None:
        """The aggregate as a record (``None`` when empty), and start over."""
        if not self.counts:
            return None
        counts = {s: self.counts.get(s, 0) for s in STATES}
        counts.update({s: n for s, n in self.counts.items() if s not in counts})
        top = dict(self.frames.most_common(TOP_FRAMES))
        handoff = dict(self.handoff)
        helper_top = dict(self.helper_frames.most_common(TOP_FRAMES))
        self.counts = Counter()
        self.frames = Counter()
        self.handoff = Counter()
        self.helper_frames = Counter()
        return LoaderActivity(
            t=t, pid=pid, counts=counts, top_frames=top, handoff=handoff, helper_frames=helper_top
        )


class StackCache:
    """Classifications of stacks seen before, by :func:`stack_signature` and role.

    A loading loop shows the same few stacks over and over; reading and
    classifying one costs about 20 µs, finding it here about 2 µs.
    """

    def __init__(self, size: int = CACHE_MAX) -> None:
        self._size = size
        self._known: dict[tuple[object, ...], tuple[str, str, bool]] = {}

    def classify(self, frame: FrameType, role: str) -> tuple[str, str]:
        """(state, frame key) of the stack from ``frame`` outwards, for ``role``."""
        state, key, _ = self.classify_wait(frame, role)
        return state, key

    def classify_wait(self, frame: FrameType, role: str) -> tuple[str, str, bool]:
        """(state, frame key, whether it waits on other threads or processes: :func:`hands_off`)."""
        signature = (role, *stack_signature(frame))
        known = self._known.get(signature)
        if known is None:
            frames = read_frames(frame)
            state = classify_for_role(frames, role)
            known = (state, frame_key(frames) if state != "idle" else "", hands_off(frames, role))
            if len(self._known) >= self._size:
                self._known.clear()
            self._known[signature] = known
        return known
