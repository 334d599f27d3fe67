"""The catalogue of messages the classifier recognises, one pattern each.

Every pattern matches one line of stderr or of an error file, already
cleaned of ANSI colours and launcher prefixes (``[rank3]:``). GPU
out-of-memory messages and Xid lines are GPU-fault semantics and live in
:mod:`trainmedic.gpu.faults`; the rest (collectives, DataLoader workers,
host memory, CUDA runtime errors, tracebacks, launchers) is here.
"""

from __future__ import annotations

import re

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PREFIX_RE = re.compile(r"^(?:\[(?:rank\d+|default\d+|[\w-]*\d+)\]:\s?)+")
COLLECTIVE_RE = re.compile(
    r"Watchdog caught collective operation timeout"
    r"|ran for \d+ milliseconds before timing out"
    r"|Timed out waiting \d+ ?ms for (?:recv|send) operation to complete"
    r"|[Hh]eartbeat monitor timed out"
    r"|DistStoreError: .*[Tt]imed out"
    r"|Timed out after \d+ seconds waiting for clients"
    # TensorFlow's collectives (MirroredStrategy, MultiWorkerMirroredStrategy)
    r"|Collective has timed out (?:during execution|waiting for other workers)"
)
NCCL_WORK_RE = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)")
NCCL_TIMEOUT_MS_RE = re.compile(r"Timeout\(ms\)=(\d+)")
GLOO_TIMEOUT_MS_RE = re.compile(r"Timed out waiting (\d+) ?ms for (recv|send)")
RANK_RE = re.compile(r"\[Rank (\d+)\]")

WORKER_RE = re.compile(
    r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([A-Za-z][A-Za-z ]*)"
    r"|exited unexpectedly(?: with exit code (-?\d+))?)"
)
SHM_RE = re.compile(
    r"insufficient shared memory|out of shared memory|raise your shared memory limit"
    r"|No space left on device.*(?:/dev/shm|torch_\d+|shm)"
    r"|(?:/dev/shm|torch_\d+|shm).*No space left on device"
)
FD_LIMIT_RE = re.compile(r"Too many open files|received \d+ items of ancdata")
LOADER_TIMEOUT_RE = re.compile(r"DataLoader timed out after (\d+) seconds")

HOST_ALLOC_RE = re.compile(
    r"std::bad_alloc|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"
    r"|Cannot allocate memory|Unable to allocate .* for an array|^(?:\w+\.)*\w*MemoryError\b"
)
HOST_ALLOC_BYTES_RE = re.compile(r"you tried to allocate (\d+) bytes")

CUDA_ERROR_RE = re.compile(
    r"CUDA error: (.+?)\.?\s*$"
    r"|(an illegal memory access was encountered)"
    r"|(uncorrectable ECC error encountered)"
    r"|cuDNN error: (CUDNN_STATUS_\w+)"
    r"|(CUBLAS_STATUS_EXECUTION_FAILED|CUBLAS_STATUS_INTERNAL_ERROR)"
    r"|NCCL error.*(unhandled cuda error)"
    r"|(CUDA driver version is insufficient)"
    # TensorFlow's (StreamExecutor names the driver's codes; a missing device or a failed
    # preallocation it recovers from are not failures)
    r"|(CUDA_ERROR_(?:ILLEGAL_ADDRESS|LAUNCH_FAILED|ECC_UNCORRECTABLE|ILLEGAL_INSTRUCTION"
    r"|MISALIGNED_ADDRESS|HARDWARE_STACK_ERROR|LAUNCH_TIMEOUT))"
    r"|(Blas x?GEMM launch failed)|(cuDNN failed to initialize)"
    r"|(DNN library (?:is not found|initialization failed))"
)
DEVICE_ASSERT_RE = re.compile(r"device-side assert triggered|Assertion `.*` failed")
DRIVER_MISMATCH = (
    "no kernel image is available",
    "driver version is insufficient",
    "invalid device function",
    "dnn library is not found",
)
CONTENTION = ("busy or unavailable",)
HARDWARE_TEXT = (
    "uncorrectable ECC",
    "ECC error",
    "ECC_UNCORRECTABLE",
    "fallen off the bus",
    "unrecoverable",
)

KERNEL_OOM_RE = re.compile(
    r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+)|oom-kill:.*task_memcg"
)
KERNEL_OOM_PID_RE = re.compile(r"Killed process (\d+)|oom-kill:.*,pid=(\d+)")

COMM_ERROR_TYPE_RE = re.compile(
    r"(?:^|\.)Dist(?:Backend|Network|Store)?Error$"
    # TensorFlow's: a worker or parameter server that went away, a collective aborted
    r"|(?:^|\.)errors_impl\.(?:Unavailable|Aborted)Error$|^(?:tf\.errors\.)?UnavailableError$"
)
COMM_ERROR_RE = re.compile(
    r"Connection (?:reset|closed) by peer|NCCL error|remote process exited"
    r"|network error|Broken pipe|ProcessGroup\w* is (?:aborted|shut ?down)"
    r"|Collective ops is aborted by|NCCL failure"
)
TORCHRUN_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
TRACEBACK_START = "Traceback (most recent call last):"
EXC_LINE_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
# Python tracebacks say `line 12, in f`; faulthandler dumps say `line 12 in f`.
FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+),? in (\S+)')
USAGE_RE = re.compile(
    r"^usage: |error: unrecognized arguments|error: the following arguments are required"
)
CANT_OPEN_RE = re.compile(
    r"can't open file .*\[Errno 2\]|No such file or directory: '.*'$|command not found"
)
