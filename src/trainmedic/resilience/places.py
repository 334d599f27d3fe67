"""Where a thread is parked: what its innermost Python frame is doing.

The probe's heartbeat carries the training thread's innermost frames (with
each frame's module), what the innermost frame is calling (read from its
bytecode: ``("time", "sleep")``) and the instruction it stands at.
:func:`classify_place` turns that into a :class:`PlaceKind` — the vocabulary
the silence classifier (:mod:`trainmedic.resilience.silence`) reasons with:

* ``sleep``: sleeping (``time.sleep``);
* ``lock``: waiting on another thread or process of the job (``lock.acquire``,
  ``Event.wait``, ``queue.get``, ``Thread.join``, a DataLoader waiting for its workers);
* ``child``: waiting for a child program (``subprocess.run``, ``os.waitpid``);
* ``peer``: in a collective, waiting on the other ranks (``dist.all_reduce``,
  ``dist.barrier``);
* ``device``: in a device synchronisation (``torch.cuda.synchronize``, ``loss.item()``);
* ``socket``: in network I/O (``sock.recv``, reads in ``urllib``, ``requests``, ``boto3``);
* ``file``: in file I/O, serialisation or compression (``f.write``, ``os.fsync``,
  ``torch.save``/``load``, ``np.load``, ``zlib.compress``);
* ``compute``: in a native library call (``torch.linalg.eigh``, ``a @ b``);
* ``python``: running Python code, or a cheap builtin between bytecodes
  (``while True: x += 1``);
* ``unknown``: no frames to tell.

Only names and modules are read, never types: a pure function of the
:class:`Place`, tested on hand-built places. A running Python thread gives
up the interpreter lock only between bytecodes (a backward jump, a function
entry, after a builtin call), so a sampler sees it at one of those
instructions; a thread parked in a native call is seen at the call or the
operator that made it (``CALL``, ``BINARY_OP``): the ``op`` field tells the
two apart where names cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trainmedic import frame_tables


class PlaceKind(str, Enum):
    SLEEP = "sleep"
    LOCK = "lock"
    CHILD = "child"
    PEER = "peer"
    DEVICE = "device"
    SOCKET = "socket"
    FILE = "file"
    COMPUTE = "compute"
    PYTHON = "python"
    UNKNOWN = "unknown"

    @property
    def waits(self) -> bool:
        """The thread waits for something else (no work of its own)."""
        return self in _WAITING

    @property
    def io(self) -> bool:
        return self in (PlaceKind.SOCKET, PlaceKind.FILE)


_WAITING = frozenset(
    {PlaceKind.SLEEP, PlaceKind.LOCK, PlaceKind.CHILD, PlaceKind.PEER, PlaceKind.DEVICE}
)


@dataclass(frozen=True)
class Place:
    """The training thread's innermost frames at one moment.

    Attributes:
        frames: ``"file:line function"``, innermost first.
        modules: each frame's module (``__name__``: ``torch.serialization``,
            ``__main__``), parallel to ``frames``; ``""`` when unknown.
        calls: the dotted name the innermost frame is calling, as parts
            (``("torch", "linalg", "eigh")``); empty when it stands at no call.
        op: the innermost frame's instruction (``CALL``, ``JUMP_BACKWARD``);
            ``""`` when unknown.
    """

    frames: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    op: str = ""

    @property
    def where(self) -> str:
        """The innermost frame, ``file:line function``."""
        return self.frames[0] if self.frames else "?"

    def describe(self) -> str:
        """``time.sleep`` at train.py:42 main."""
        call = ".".join(self.calls)
        return f"`{call}` at {self.where}" if call else self.where


BREAKER_OPS = frozenset(
    {
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
        "POP_JUMP_IF_TRUE",
        "POP_JUMP_IF_FALSE",
        "JUMP_ABSOLUTE",
        "RESUME",
        "RESUME_CHECK",
        "PRECALL",
        "ENTER_EXECUTOR",
    }
)
"""Instructions where running Python code lets other threads take the
interpreter lock (where a sampler finds a thread that is executing bytecode).
From 3.12 on, ``CALL`` is one too (after a builtin returns)."""

CALL_OPS = frozenset(
    {
        "CALL",
        "CALL_KW",
        "CALL_FUNCTION",
        "CALL_FUNCTION_KW",
        "CALL_FUNCTION_EX",
        "CALL_METHOD",
    }
)

# --- what names and modules say ------------------------------------------------------------


def _words(text: str) -> list[str]:
    return text.split()


_PEER_MODULES = tuple(
    _words(
        "torch.distributed torch._C._distributed deepspeed.comm horovod "
        "megatron.core.parallel_state apex.parallel jax._src.distributed "
        "torch_xla.core.xla_model"
    )
)
_NOT_PEER_MODULES = tuple(
    # torchrun's agent sleeps in its monitor loop under these: a launcher, not a rank.
    _words(
        "torch.distributed.checkpoint torch.distributed.elastic torch.distributed.launcher "
        "torch.distributed.run"
    )
)
_COLLECTIVES = frozenset(
    _words(
        "all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all "
        "all_to_all_single barrier monitored_barrier broadcast broadcast_object_list reduce "
        "reduce_scatter reduce_scatter_tensor gather gather_object scatter "
        "scatter_object_list send recv isend irecv batch_isend_irecv allreduce allgather "
        "init_process_group new_group"
    )
)
_DIST_ROOTS = frozenset({"dist", "distributed", "torch", "c10d", "hvd", "deepspeed", "comm"})
_DEVICE_SYNC = frozenset({"synchronize", "item", "tolist", "cpu", "numpy", "query"})

_SLEEP_CALLS = frozenset({"sleep", "usleep", "nanosleep", "pause", "sigwait", "sigtimedwait"})
_LOCK_MODULES = tuple(
    _words(
        "threading queue multiprocessing concurrent.futures selectors asyncio "
        "torch.multiprocessing torch.utils.data.dataloader"
    )
)
_LOCK_CALLS = frozenset(
    _words(
        "acquire wait wait_for join get put result exception select poll epoll kqueue "
        "recv_bytes recv_bytes_into _recv_bytes _poll as_completed lockf flock"
    )
)
_CHILD_MODULES = ("subprocess",)
_CHILD_CALLS = frozenset(
    {"waitpid", "wait3", "wait4", "waitid", "communicate", "check_call", "check_output", "run"}
)
_SOCKET_MODULES = frame_tables.NETWORK_LIBRARIES
_SOCKET_CALLS = frozenset(
    _words(
        "recv recv_into recvfrom recvfrom_into recvmsg accept connect create_connection "
        "getaddrinfo gethostbyname sendall sendfile urlopen urlretrieve getresponse "
        "do_handshake"
    )
)
_SOCKET_IO = frozenset({"read", "readinto", "write", "recv", "send"})
_SOCKET_NAMES = frozenset({"sock", "socket", "_sock", "conn", "connection", "session", "client"})
# Parked in a serialiser, a compressor or a codec is file work too (a thread silent in
# ``pickle.dump`` or ``cv2.imread``): the readers of files, and these.
_FILE_MODULES = (
    *frame_tables.FILE_LIBRARIES,
    *_words(
        "torch.distributed.checkpoint torch.hub pickle _pickle zlib zstandard lz4 io codecs "
        "json csv PIL cv2 torchvision.io torchaudio pyarrow pandas.io datasets tensorboard "
        "orjson msgpack joblib fsspec"
    ),
)
_FILE_CALLS = frozenset(
    _words(
        "read readinto readline readlines readall read_bytes read_text write writelines "
        "write_bytes write_text write_record flush fsync fdatasync sync sync_file_range close "
        "truncate save savez savez_compressed save_file load load_file loadtxt savetxt "
        "fromfile tofile dump dumps loads compress decompress copyfile copyfileobj copy copy2 "
        "copytree move rmtree open imread imwrite imdecode pread pwrite preadv pwritev mmap "
        "replace rename"
    )
)
_COMPUTE_MODULES = tuple(
    _words(
        "torch numpy scipy sklearn jax jaxlib tensorflow cupy numba triton xformers "
        "flash_attn apex transformer_engine einops pandas faiss sentencepiece tokenizers "
        "transformers timm torchvision torchaudio hashlib math"
    )
)
_COMPUTE_ROOTS = frozenset(
    _words(
        "torch np numpy scipy sp F nn jnp jax tf cp cupy sklearn linalg la fft special math "
        "hashlib faiss einops pd"
    )
)
_CHEAP_CALLS = frozenset(
    _words(
        "len isinstance issubclass getattr setattr hasattr id type time monotonic "
        "perf_counter time_ns monotonic_ns perf_counter_ns locked is_set is_alive empty full "
        "qsize exists isfile isdir print append pop popleft keys values items format str repr "
        "int float bool range next iter min max abs random randint uniform getpid kill info "
        "debug log is_initialized is_available"
    )
)


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _is_peer_module(module: str) -> bool:
    return _in(module, _PEER_MODULES) and not _in(module, _NOT_PEER_MODULES)


def classify_place(place: Place, depth: int = 6) -> PlaceKind:
    """What the thread at ``place`` is doing (see the module docstring).

    The innermost frame decides when its call or module is telling; the
    frames around it (up to ``depth``) give the context of generic waits: a
    ``select`` inside ``requests`` is network I/O, inside ``subprocess`` a
    wait for a child, inside a collective's helper a peer wait.
    """
    calls = place.calls
    last = calls[-1] if calls else ""
    root = calls[0] if calls else ""
    modules = place.modules[:depth]
    inner = modules[0] if modules else ""
    if not place.frames:
        return PlaceKind.UNKNOWN
    if any(_is_peer_module(m) for m in modules) or (
        last in _COLLECTIVES and (root in _DIST_ROOTS or len(calls) == 1)
    ):
        return PlaceKind.PEER
    if last == "synchronize" or (last in _DEVICE_SYNC and _in(inner, ("torch.cuda",))):
        return PlaceKind.DEVICE
    if last in _SLEEP_CALLS:
        return PlaceKind.SLEEP
    if (
        any(_in(m, _SOCKET_MODULES) for m in modules)
        or last in _SOCKET_CALLS
        or (last in _SOCKET_IO and any(n in _SOCKET_NAMES for n in calls[:-1]))
    ):
        return PlaceKind.SOCKET
    if any(_in(m, _CHILD_MODULES) for m in modules) or (
        last in _CHILD_CALLS and root in ("os", "subprocess")
    ):
        return PlaceKind.CHILD
    if _in(inner, _LOCK_MODULES):
        return PlaceKind.LOCK
    if _in(inner, _FILE_MODULES) or last in _FILE_CALLS:
        return PlaceKind.FILE
    if last in _LOCK_CALLS:
        return PlaceKind.LOCK
    if _in(inner, _COMPUTE_MODULES):
        return PlaceKind.COMPUTE
    if any(_in(m, _FILE_MODULES) for m in modules[1:]):
        return PlaceKind.FILE
    if last in _DEVICE_SYNC and place.op in CALL_OPS and last != "cpu":
        # ``loss.item()`` parked at the call: the host waits for the device.
        return PlaceKind.DEVICE
    if not calls:
        return PlaceKind.COMPUTE if native_op(place) else PlaceKind.PYTHON
    return _call_kind(place, last, root)


def _call_kind(place: Place, last: str, root: str) -> PlaceKind:
    """The innermost frame is the caller's own code, standing at a call."""
    if root in _COMPUTE_ROOTS:
        return PlaceKind.COMPUTE
    if last in _CHEAP_CALLS:
        return PlaceKind.PYTHON
    # A method or function of unknown nature parked at its call: native code
    # (``x.matmul(y)``, ``model.generate(...)``); whether it works or spins is
    # for the CPU and the interpreter lock to tell.
    return PlaceKind.COMPUTE if place.op not in BREAKER_OPS else PlaceKind.PYTHON


_NATIVE_OP_PREFIXES = tuple(
    _words(
        "BINARY_ INPLACE_ UNARY_ COMPARE_OP CONTAINS_OP STORE_SUBSCR DELETE_SUBSCR FOR_ITER "
        "GET_ITER IMPORT_NAME"
    )
)


def native_op(place: Place) -> bool:
    """The innermost frame stands at an operator that dispatches to native code
    (``a @ b``, ``x[i]``, the next item of a C iterator), where a running thread
    never yields: it is inside that code, which released the interpreter lock.
    Jumps, function entries and calls are not such places."""
    op = place.op
    return op.startswith(_NATIVE_OP_PREFIXES) and "JUMP" not in op
