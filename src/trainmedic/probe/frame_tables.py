"""What a stack frame's file or call says it is doing: the one table of each.

The data-wait classifier (:mod:`trainmedic.probe.stacks`) and the classifier
of the time between steps (:mod:`trainmedic.probe.host_states`) read the same
frames with different questions, so each takes these tables and states how it
differs from them (outside the data wait, copying a file is writing one, and a
bare ``get``/``post`` on a ``session`` or ``client`` is a network call).
"""

from __future__ import annotations

SOCKET_PATHS = (
    "/socket.py", "/ssl.py", "/http/client.py", "/urllib/request.py", "/urllib3/",
    "/requests/", "/httpx/", "/httpcore/", "/aiohttp/", "/botocore/", "/boto3/",
    "/s3transfer/", "/s3fs/", "/gcsfs/", "/google/cloud/storage/", "/azure/storage/",
    "/fsspec/implementations/http", "/smart_open/", "/grpc/", "/paramiko/", "/ftplib.py",
    "/websocket/",
)  # fmt: skip
"""Files whose frames wait on the network: sockets, HTTP clients, object stores."""

FILE_PATHS = (
    "/numpy/lib/npyio.py", "/numpy/lib/_npyio_impl.py", "/numpy/lib/format.py",
    "/numpy/lib/_format_impl.py", "/numpy/core/memmap.py", "/numpy/_core/memmap.py",
    "/h5py/", "/pyarrow/parquet/", "/safetensors/", "/torch/serialization.py", "/imageio/",
    "/tifffile/", "/soundfile.py", "/librosa/core/audio.py", "/zipfile.py", "/zipfile/",
    "/tarfile.py", "/gzip.py", "/bz2.py", "/lzma.py", "/_compression.py", "/shutil.py",
    "/glob.py", "/genericpath.py", "/_pyio.py", "/lmdb/",
)  # fmt: skip
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
