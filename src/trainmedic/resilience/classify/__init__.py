"""Why did the attempt end? Failure classes from the evidence an exit leaves.

The supervisor gathers a :class:`FailureEvidence` after each attempt (exit
status, the last lines of stderr, the probe's error files, the cgroup's
``oom_kill`` count, whether its watchdog declared a hang, kernel log lines)
and :func:`classify_failure` names the :class:`FailureClass`, the root-cause
:class:`~trainmedic.findings.model.Category`, how sure it is and the lines
that prove it. Pure: no I/O, no clock.

How the evidence is weighed (docs/restarts.md, "Failure classes"):

1. Exit status 0 without a declared hang is :attr:`FailureClass.SUCCESS`.
2. A command that never ran (exit 126/127, a launch error) is ``BAD_COMMAND``.
3. The watchdog's hang verdict is ``HANG`` — unless NCCL/gloo's own watchdog
   reported a collective timeout (``COLLECTIVE_TIMEOUT``) or the kernel logged
   a hardware Xid (``CUDA_ERROR``), which explain the hang.
4. A specific message (CUDA OOM, collective timeout, DataLoader worker death,
   host allocation failure, CUDA error) in the earliest error file, else the
   earliest such line in stderr: the earliest failure is the root cause,
   later ones are other ranks reacting to it. CUDA error 802 (the Fabric
   Manager not running) is a ``CUDA_ERROR`` of the machine (``node_fault``).
5. Hardware Xid / ECC evidence with no specific message: ``CUDA_ERROR``.
6. The exit signal: SIGKILL with OOM-killer evidence is ``HOST_OOM_KILL``;
   SIGTERM/SIGINT/SIGHUP ``PREEMPTED``; SIGSEGV/SIGBUS/SIGILL/SIGFPE
   ``SEGFAULT``; SIGABRT ``ABORT``.
7. A distributed communication error (a lost peer) is ``UNKNOWN`` with
   category ``network``; any other Python exception is ``USER_EXCEPTION``;
   exit 2 with a usage message is ``BAD_COMMAND``; the rest is ``UNKNOWN``.

The package, by job:

- :mod:`.model` — the evidence, the failure classes and the verdict;
- :mod:`.patterns` — the catalogue of messages recognised;
- :mod:`.text` — cleaning lines, exit signals, tracebacks and frames;
- :mod:`.matchers` — specific messages (step 4);
- :mod:`.hardware` — Xids and GPU faults (steps 3 and 5);
- :mod:`.endings` — hangs, bad commands, signals and exceptions (2, 3, 6, 7);
- :mod:`.classifier` — :func:`classify_failure`, the order above;
- :mod:`.findings` — :func:`classification_to_finding` and the fix texts.
"""

from trainmedic.gpu.types import GpuRef
from trainmedic.resilience.classify.classifier import classify_failure
from trainmedic.resilience.classify.findings import classification_to_finding
from trainmedic.resilience.classify.model import (
    STDERR_TAIL_LINES,
    Classification,
    Confidence,
    FailureClass,
    FailureEvidence,
    GpuFault,
)

__all__ = [
    "STDERR_TAIL_LINES",
    "Classification",
    "Confidence",
    "FailureClass",
    "FailureEvidence",
    "GpuFault",
    "GpuRef",
    "classification_to_finding",
    "classify_failure",
]
