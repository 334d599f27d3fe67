"""What the training thread does between steps when no DataLoader feeds it.

A script without a DataLoader spends the time outside forward, backward and
the optimizer on whatever its loop does: building the next batch, but just as
well sleeping, logging, synchronising with the GPU, writing checkpoints or
running Python bookkeeping. That time is *data preparation* only when the
stacks say so; :func:`classify_outside` names each sample of the training
thread's stack taken there (role ``self`` of :mod:`trainmedic.probe.stacks`):

* data: ``file_read``, ``socket_wait`` (the batch's bytes arriving),
  ``ipc_wait`` (waiting on another thread or process that makes the batch: a
  pool's futures, a queue a prefetch thread or producer processes fill, an
  event another thread sets, an asyncio loop elsewhere -
  :func:`waits_on_others`; :mod:`trainmedic.probe.handoff` samples what they do)
  and ``transform`` (Python computing in data code: a data library such as
  torchvision, PIL or numpy.random on the stack; a function or file of the
  script named for data — ``make_batch``, ``featurize``, ``dataset.py``; or
  a tensor being made from host data — ``torch.tensor``, ``torch.randn``,
  ``from_numpy``, ``stack``);
* not data: ``sleep`` (``time.sleep`` in the loop; in a function named for
  data it is the source being polled or rate-limited: ``ipc_wait``), ``log`` (printing, ``logging``,
  progress bars, experiment trackers, or a function of the script named for
  it), ``sync`` (``.item()``, ``.cpu()``, ``.numpy()``, ``tolist``,
  ``cuda.synchronize``: waiting for the device), ``file_write`` (``torch.save``,
  pickling, writing files: checkpoint I/O), ``python`` (other Python code:
  the loop's own overhead) and ``other`` (a C call none of this recognises).

Pure functions of the frames, tested on their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainmedic import frame_tables as tables
from trainmedic.probe.frames import FrameInfo, is_library, threading_blocks

_LOG_PATHS = (
    "/logging/",
    "/tqdm/",
    "/wandb/",
    "/tensorboard/",
    "/tensorboardX/",
    "/torch/utils/tensorboard/",
    "/mlflow/",
    "/rich/",
    "/loguru/",
    "/absl/logging/",
    "/comet_ml/",
    "/neptune/",
    "/clearml/",
    "/aim/",
    "/lightning/pytorch/loggers/",
    "/pytorch_lightning/loggers/",
)
_DATA_PATHS = (
    "/torch/utils/data/",
    "/torchvision/",
    "/torchaudio/",
    "/torchtext/",
    "/PIL/",
    "/cv2/",
    "/albumentations/",
    "/skimage/",
    "/imageio/",
    "/datasets/",
    "/tokenizers/",
    "/sentencepiece/",
    "/transformers/tokenization",
    "/transformers/feature_extraction",
    "/transformers/image_processing",
    "/transformers/data/",
    "/webdataset/",
    "/numpy/random/",
    "/pandas/io/",
    "/nltk/",
    "/spacy/",
    "/librosa/",
    "/timm/data/",
    "/nvidia/dali/",
    "/ffcv/",
    "/streaming/",
)
# (path part, functions that write): the rest of such files may read.
_WRITE_FUNCTIONS = (
    ("/torch/serialization.py", frozenset({"save", "_save", "_legacy_save"})),
    ("/safetensors/", frozenset({"save", "save_file", "save_model"})),
    ("/pickle.py", frozenset({"dump", "_dump"})),
    ("/numpy/lib/npyio.py", frozenset({"save", "savez", "savez_compressed", "_savez", "savetxt"})),
    ("/numpy/lib/_npyio_impl.py", frozenset({"save", "savez", "savez_compressed", "_savez"})),
    ("/shutil.py", frozenset({"copyfile", "copy", "copy2", "copyfileobj", "move"})),
)
_SYNC_FUNCTIONS = (
    ("/torch/cuda/__init__.py", frozenset({"synchronize"})),
    ("/torch/cuda/streams.py", frozenset({"synchronize", "wait_stream", "wait_event"})),
    ("/torch/_tensor.py", frozenset({"tolist", "numpy", "__array__"})),
)
_SLEEP_CALLS = frozenset({"sleep"})
_SYNC_CALLS = frozenset(
    {"item", "tolist", "cpu", "numpy", "synchronize", "wait_stream", "wait_event", "nonzero"}
)
_WRITE_CALLS = frozenset(
    {"save", "savez", "savez_compressed", "save_file", "dump", "write", "writelines", "fsync",
     "flush", "rename", "replace", "copyfile", "copy2"}
)  # fmt: skip
_LOG_CALLS = frozenset({"print", "pprint", "log", "info", "debug", "warning", "add_scalar"})
_CONSOLE_NAMES = frozenset({"sys", "stdout", "stderr", "logger", "logging", "log", "writer"})
_READ_CALLS = tables.READ_CALLS
_SOCKET_CALLS = tables.SOCKET_CALLS | {"get", "post"}  # with a client's name
_SOCKET_NAMES = tables.SOCKET_NAMES | {"session", "client", "s3"}
_TENSOR_CALLS = frozenset(
    {"tensor", "as_tensor", "from_numpy", "stack", "cat", "randn", "rand", "randint", "randperm",
     "normal", "zeros", "ones", "empty", "full", "arange", "linspace", "frombuffer",
     "pin_memory", "to", "cuda", "contiguous"}
)  # fmt: skip
_SOCKET_PATHS = tables.SOCKET_PATHS
# Outside the data wait, copying files is writing them (``_WRITE_FUNCTIONS``).
_READ_PATHS = tuple(p for p in tables.FILE_PATHS if p != "/shutil.py")
_IPC_PATHS = tables.IPC_QUEUE_PATHS
_DELEGATING = tables.DELEGATING_PATHS
# Where a wait on another thread or process shows: the libraries that hand work over,
# and the primitives of threading a loop waits on directly.
_HANDOFF_PATHS = ("/concurrent/futures/", "/queue.py", "/multiprocessing/", "/asyncio/")
_WAIT_CALLS = frozenset({"wait", "wait_for", "result", "acquire", "recv_bytes", "poll"})
_QUEUE_WORDS = frozenset({"queue", "q", "inbox", "ready", "results", "pending", "prefetched"})

_DATA_WORDS = frozenset(
    {"data", "dataset", "datasets", "dataloader", "batch", "batches", "batcher", "sample",
     "samples", "sampler", "load", "loader", "loading", "read", "reader", "fetch", "feature",
     "features", "featurize", "featurise", "token", "tokens", "tokenize", "tokenise",
     "tokenizer", "augment", "augmentation", "augmentations", "transform", "transforms",
     "collate", "preprocess", "preprocessing", "prepare", "decode", "decoder", "crop", "resize",
     "normalize", "normalise", "encode", "synth", "synthesize", "synthetic", "shuffle",
     "getitem", "iter", "next", "sentence", "sentences", "image", "images", "audio", "corpus",
     "example", "examples", "input", "inputs", "generate", "generator", "minibatch", "prefetch",
     "prefetcher", "pipeline", "record", "records", "shard", "shards"}
)  # fmt: skip
_LOG_WORDS = frozenset(
    {"log", "logs", "logger", "logging", "print", "report", "metric", "metrics", "stats",
     "summary", "summaries", "progress", "display", "show", "plot", "visualize", "track",
     "tracker", "monitor"}
)  # fmt: skip
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\b|_|\d)|[A-Z]?[a-z]+|\d+")
_words_cache: dict[str, frozenset[str]] = {}
_CACHE_MAX = 4096


def name_words(name: str) -> frozenset[str]:
    """Lower-case words of an identifier or file stem: ``makeBatch_v2`` -> make, batch, v, 2."""
    cached = _words_cache.get(name)
    if cached is None:
        if len(_words_cache) >= _CACHE_MAX:
            _words_cache.clear()
        cached = frozenset(w.lower() for w in _WORD.findall(name))
        _words_cache[name] = cached
    return cached


def _stem(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return base[:-3] if base.endswith(".py") else base


def _callee_state(callees: tuple[str, ...]) -> str | None:
    """The state a C call made from the innermost frame decides."""
    if not callees:
        return None
    last = callees[-1]
    names = set(callees[:-1])
    if last in _SLEEP_CALLS:
        return "sleep"
    if last in _SYNC_CALLS:
        return "sync"
    if last in _LOG_CALLS or (last in ("write", "flush") and names & _CONSOLE_NAMES):
        return "log"
    if last in _SOCKET_CALLS and (last not in ("get", "post") or names & _SOCKET_NAMES):
        return "socket_wait"
    if names & _SOCKET_NAMES and last in ("recv", "read", "send"):
        return "socket_wait"
    if last in _WRITE_CALLS:
        return "file_write"
    if last in _READ_CALLS:
        return "file_read"
    if last in _TENSOR_CALLS:
        return "transform"
    return None


def _frame_function_state(frame: FrameInfo) -> str | None:
    """``file_write``, ``sync`` or ``log`` when a frame anywhere on the stack says so."""
    path = frame.path
    for part, functions in _WRITE_FUNCTIONS:
        if part in path and frame.function in functions:
            return "file_write"
    for part, functions in _SYNC_FUNCTIONS:
        if part in path and frame.function in functions:
            return "sync"
    if any(p in path for p in _LOG_PATHS):
        return "log"
    return None


def _path_state(frame: FrameInfo) -> str | None:
    """The state a frame's file decides; ``"delegate"`` for frames that wait for a caller."""
    path = frame.path
    if any(p in path for p in _SOCKET_PATHS):
        return "socket_wait"
    if any(p in path for p in _READ_PATHS):
        return "file_read"
    if any(p in path for p in _IPC_PATHS):
        return "ipc_wait"
    if any(path.endswith(p) for p in _DELEGATING):
        return "delegate"
    return None


def _script_state(frame: FrameInfo) -> str | None:
    """What a frame of the script's own code says by its name: ``log`` or data."""
    words = name_words(frame.function) | name_words(_stem(frame.path))
    if words & _LOG_WORDS:
        return "log"
    if words & _DATA_WORDS:
        return "transform"
    return None


def _data_named(frame: FrameInfo) -> bool:
    """A frame of the script's own code whose function is named for data."""
    if is_library(frame.filename):
        return False
    words = name_words(frame.function)
    return bool(words & _DATA_WORDS) and not words & _LOG_WORDS


def _in_data_code(frames: Sequence[FrameInfo]) -> bool:
    return any(any(p in f.path for p in _DATA_PATHS) for f in frames)


def waits_on_others(frames: Sequence[FrameInfo]) -> bool:
    """Whether a stack of the training thread waits on another thread or process: a
    future, a queue, an event or condition another thread sets, a multiprocessing
    queue or pipe, an asyncio loop running elsewhere (innermost frame first).

    Shutting down (joining threads at exit) is not such a wait.
    """
    if not frames:
        return False
    leaf = frames[0]
    if leaf.path.endswith("/threading.py"):
        if not threading_blocks(frames):
            return False  # ``stop.is_set()``, ``event.set()``: the loop runs on
        for frame in frames:
            if frame.function in ("join", "_wait_for_tstate_lock", "_shutdown"):
                return False
            if any(frame.path.endswith(p) for p in _DELEGATING):
                continue
            # An event, condition or semaphore the loop itself waits on, or one a
            # library that hands work over waits on for it.
            return not is_library(frame.filename) or any(p in frame.path for p in _HANDOFF_PATHS)
        return False
    for frame in frames:
        if any(frame.path.endswith(p) for p in _DELEGATING):
            continue
        if any(p in frame.path for p in _HANDOFF_PATHS):
            return True
        break
    callees = leaf.callees
    if callees and not is_library(leaf.filename):
        last = callees[-1]
        if last in _WAIT_CALLS:
            return True
        if last == "get" and any(name_words(n) & _QUEUE_WORDS for n in callees[:-1]):
            return True  # a queue implemented in C (queue.SimpleQueue)
    return False


def classify_outside(frames: Sequence[FrameInfo]) -> str:
    """The state of one stack of the training thread between steps, innermost frame first."""
    if not frames:
        return "other"
    # A write, a device sync or a logging library anywhere on the stack names the
    # whole sample: torch.save reads as much as it writes inside, a logger may
    # end in a socket.
    for frame in frames:
        state = _frame_function_state(frame)
        if state is not None:
            return state
    if waits_on_others(frames):
        # Waiting for a producer: a pool's futures, a prefetch thread's queue, producer
        # processes, an event loop elsewhere (what they do is sampled meanwhile).
        return "ipc_wait"
    leaf = _callee_state(frames[0].callees)
    if leaf == "sleep" and _data_named(frames[0]):
        # A data function that sleeps polls or rate-limits its source: waiting for data.
        return "ipc_wait"
    if leaf is not None:
        return leaf
    for frame in frames:
        state = _path_state(frame)
        if state == "delegate":
            continue
        if state is not None:
            return state
        break
    if _in_data_code(frames):
        return "transform"
    # The script's own frames, innermost first: the nearest named one decides.
    for frame in frames:
        if is_library(frame.filename):
            continue
        state = _script_state(frame)
        if state is not None:
            return state
    leaf_path = frames[0].path
    if any(leaf_path.endswith(p) for p in _DELEGATING) and (
        not leaf_path.endswith("/threading.py") or threading_blocks(frames)
    ):
        return "other"  # waiting on a lock, an event or a child: not Python running
    return "python"
