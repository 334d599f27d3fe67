"""Each failure class once: its title, its fix and whether it is retried by default.

The classifier's patterns decide the class (:mod:`.patterns`, :mod:`.matchers`); what a
class then means to a person and to the restart policy is here: the findings
(:mod:`.findings`) and the policy's default
(:data:`~trainmedic.resilience.policy.NOT_RETRIED_BY_DEFAULT`) read this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmedic.findings.fixes import CUDA_OOM_FIX, RESILIENT_DATA_FIX
from trainmedic.resilience.classify.model import FailureClass


@dataclass(frozen=True)
class ClassInfo:
    """What one failure class means.

    Attributes:
        title: the finding's title (its reason follows it).
        fix: what to do, for torch jobs (TensorFlow's own words: ``TENSORFLOW_FIXES``
            in :mod:`.findings`).
        retried: restarted by the default policy. A bug fails the same way again, a bad
            command never runs, and a job stopped from outside was stopped on purpose.
    """

    title: str
    fix: str
    retried: bool = True


CLASSES: dict[FailureClass, ClassInfo] = {
    FailureClass.HANG: ClassInfo(
        "The job hung",
        (
            "Read the main thread's stack in the hang report: a collective that one rank never "
            "reached, a DataLoader worker blocked on a lock, or a deadlock between threads are the "
            "usual causes. If a step or an unmarked evaluation really takes that long, pass "
            "--timeout SECONDS."
        ),
    ),
    FailureClass.CUDA_OOM: ClassInfo(
        "The job ran out of GPU memory",
        CUDA_OOM_FIX,
    ),
    FailureClass.HOST_ALLOC_FAILURE: ClassInfo(
        "A host memory allocation failed",
        (
            "Host memory ran short: lower DataLoader num_workers and prefetch_factor (each worker "
            "holds a copy of the dataset object), memory-map data instead of loading it into RAM, "
            "or run where more memory is available."
        ),
    ),
    FailureClass.HOST_OOM_KILL: ClassInfo(
        "The host OOM killer killed the job",
        (
            "The kernel OOM killer ended the job: raise the memory limit of the container or job, "
            "lower DataLoader num_workers and prefetch_factor, and memory-map large datasets."
        ),
    ),
    FailureClass.CUDA_ERROR: ClassInfo(
        "A CUDA error ended the job",
        (
            "Rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel; check custom CUDA "
            "extensions and the torch build against the driver (trainmedic doctor)."
        ),
    ),
    FailureClass.COLLECTIVE_TIMEOUT: ClassInfo(
        "A collective operation timed out",
        (
            "Find the rank that did not reach the collective (its stack differs from the others'): "
            "uneven batches across ranks (use DistributedSampler with drop_last=True), one rank "
            "loading data much slower, or a rank that crashed first. Raise "
            "init_process_group(timeout=...) only if the operation is legitimately slow; "
            "NCCL_DEBUG=WARN logs NCCL's view."
        ),
    ),
    FailureClass.DATALOADER_WORKER_DIED: ClassInfo(
        "A DataLoader worker died",
        ("Reproduce with num_workers=0 to see the dataset's own error. " + RESILIENT_DATA_FIX),
    ),
    FailureClass.SEGFAULT: ClassInfo(
        "The job crashed in native code",
        (
            "Run with PYTHONFAULTHANDLER=1 to get the Python stack at the crash; suspect native "
            "extensions and mismatched builds (trainmedic doctor)."
        ),
    ),
    FailureClass.ABORT: ClassInfo(
        "The job aborted",
        (
            "The line after 'terminate called' names the C++ exception; run with "
            "PYTHONFAULTHANDLER=1 for the Python stack."
        ),
    ),
    FailureClass.USER_EXCEPTION: ClassInfo(
        "The job raised an exception",
        (
            "Fix the exception at the location shown; trainmedic does not restart a bug, "
            "because it would fail the same way again."
        ),
        retried=False,
    ),
    FailureClass.BAD_COMMAND: ClassInfo(
        "The command could not run",
        "Check the command line: the program, its path and its arguments.",
        retried=False,
    ),
    FailureClass.PREEMPTED: ClassInfo(
        "The job was stopped from outside",
        (
            "The job was stopped from outside; run it again with trainmedic run to resume "
            "from the last checkpoint."
        ),
        retried=False,
    ),
    FailureClass.SUCCESS: ClassInfo(
        "The job finished",
        "",
    ),
    FailureClass.UNKNOWN: ClassInfo(
        "The job failed for an unknown reason",
        (
            "Look at the job's full log; run with PYTHONFAULTHANDLER=1 and check the kernel log "
            "(dmesg) for OOM kills."
        ),
    ),
}
