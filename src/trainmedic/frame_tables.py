"""What a stack frame's module, file or call says it is doing: the one table of each.

Three classifiers read frames with different questions: the data-wait classifier
(:mod:`trainmedic.probe.stacks`), the classifier of the time between steps
(:mod:`trainmedic.probe.host_states`), both from file paths, and the classifier of
where a silent thread is parked (:mod:`trainmedic.resilience.places`), from module
names. The libraries that wait on the network or read files are listed here once, by
module name; the path forms the probe matches are derived from them
(:func:`library_paths`), and each classifier states how it differs (outside the data
wait, copying a file is writing one; a bare ``get``/``post`` on a ``session`` or
``client`` is a network call; a parked thread in a serialiser or an image codec is in
file work).
"""

from __future__ import annotations


def library_paths(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The parts of a source file's path that put a frame inside one of ``modules``:
    ``http.client`` -> ``/http/client.py`` and ``/http/client/`` (a module or a package)."""
    out: list[str] = []
    for module in modules:
        stem = "/" + module.replace(".", "/")
        out += [stem + ".py", stem + "/"]
    return tuple(out)


NETWORK_LIBRARIES = (
    "socket", "ssl", "http.client", "urllib.request", "urllib3", "requests", "httpx",
    "httpcore", "aiohttp", "botocore", "boto3", "s3transfer", "s3fs", "gcsfs",
    "google.cloud.storage", "google.resumable_media", "azure.storage",
    "fsspec.implementations.http", "smart_open", "grpc", "paramiko", "ftplib", "websocket",
    "websockets", "redis", "pymongo", "webdataset.gopen", "huggingface_hub",
)  # fmt: skip
"""Modules whose frames wait on the network: sockets, HTTP clients, object stores,
remote databases."""

FILE_LIBRARIES = (
    "numpy.lib.npyio", "numpy.lib._npyio_impl", "numpy.lib.format", "numpy.lib._format_impl",
    "numpy.core.memmap", "numpy._core.memmap", "h5py", "pyarrow.parquet", "safetensors",
    "torch.serialization", "imageio", "tifffile", "soundfile", "librosa.core.audio", "zipfile",
    "tarfile", "gzip", "bz2", "lzma", "_compression", "shutil", "glob", "genericpath", "_pyio",
    "lmdb",
)  # fmt: skip
"""Modules whose frames read (or copy) files."""

SOCKET_PATHS = library_paths(NETWORK_LIBRARIES)
"""Files whose frames wait on the network."""
FILE_PATHS = library_paths(FILE_LIBRARIES)
"""Files whose frames read (or copy) files."""

IPC_QUEUE_PATHS = (
    "/multiprocessing/queues.py",
    "/multiprocessing/connection.py",
    "/queue.py",
    "/concurrent/futures/",
)
"""Where a frame waits for another thread's or process's result."""
IPC_PATHS = (
    *IPC_QUEUE_PATHS,
    "/multiprocessing/synchronize.py",
    "/multiprocessing/managers.py",
    "/multiprocessing/reduction.py",
    "/multiprocessing/resource_sharer.py",
    "/torch/multiprocessing/reductions.py",
)
""":data:`IPC_QUEUE_PATHS` and the rest of passing data between processes."""

DELEGATING_PATHS = ("/selectors.py", "/threading.py", "/subprocess.py")
"""Frames that only wait on behalf of a caller: the caller decides."""

THREADING_WAITS = frozenset(
    {"wait", "wait_for", "acquire", "_acquire_restore", "__enter__", "_wait", "_enter",
     "join", "_wait_for_tstate_lock"}
)  # fmt: skip
"""The functions of ``threading.py`` in which a thread may block: a condition's wait
(an event's, a queue's, a future's go through it), a semaphore's acquire, entering a
condition (its lock), a barrier's wait, a join. The rest (``Event.is_set``, ``set``,
``notify``, ``current_thread`` ...) return at once: a thread sampled in them runs."""

READ_CALLS = frozenset(
    {"read", "readinto", "readline", "readlines", "read_bytes", "read_text", "pread",
     "fromfile", "loadtxt", "genfromtxt", "memmap", "imread", "load", "load_file"}
)  # fmt: skip
"""C calls made from Python that read a file's bytes."""
FILE_CALLS = READ_CALLS | frozenset(
    {"open", "preadv", "readv", "listdir", "scandir", "stat", "lstat", "fstat", "exists",
     "isfile", "isdir", "getsize", "sendfile"}
)  # fmt: skip
""":data:`READ_CALLS` and the file system's metadata calls."""

SOCKET_CALLS = frozenset(
    {"recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "send", "sendall", "sendto",
     "connect", "connect_ex", "create_connection", "getaddrinfo", "gethostbyname", "urlopen",
     "urlretrieve", "getresponse", "accept"}
)  # fmt: skip
"""C calls made from Python that wait on the network."""
SOCKET_NAMES = frozenset(
    {"socket", "requests", "urllib", "urllib3", "http", "httpx", "boto3", "botocore", "ssl"}
)
"""Names in a call's chain (``requests.get``) that make it a network call."""
