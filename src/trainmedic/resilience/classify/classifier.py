"""The order in which the evidence is weighed (see the package docstring)."""

from __future__ import annotations

import dataclasses

from trainmedic.findings.model import Category
from trainmedic.resilience.classify.endings import (
    bad_command,
    from_signal,
    hang,
    user_exception,
)
from trainmedic.resilience.classify.hardware import hardware_evidence, with_hardware
from trainmedic.resilience.classify.matchers import specific_from_lines, specific_from_report
from trainmedic.resilience.classify.model import Base, Classification, FailureClass, FailureEvidence
from trainmedic.resilience.classify.patterns import CANT_OPEN_RE, USAGE_RE
from trainmedic.resilience.classify.text import (
    clean,
    exit_signal,
    root_report,
    signal_phrase,
    tail,
)

_MEMORY_CLASSES = frozenset(
    {
        FailureClass.HOST_OOM_KILL,
        FailureClass.HOST_ALLOC_FAILURE,
        FailureClass.DATALOADER_WORKER_DIED,
    }
)


def classify_failure(evidence: FailureEvidence) -> Classification:
    """Name the failure class of one attempt from its evidence (see module docstring)."""
    c = _classify(evidence)
    if evidence.num_workers is not None and c.failure_class in _MEMORY_CLASSES:
        # The worker count is what the fewer-workers remedy halves.
        details = {**c.details, "num_workers": evidence.num_workers}
        c = dataclasses.replace(c, details=details)
    return c


def _classify(evidence: FailureEvidence) -> Classification:
    lines = [clean(line) for line in evidence.stderr_tail]
    signum, signal_source = exit_signal(evidence.exit_code, lines)
    base = Base(evidence.exit_code, signum)

    if evidence.exit_code == 0 and not evidence.hang_declared:
        return base.make(
            FailureClass.SUCCESS, Category.TIMEOUT, "high", "the job exited with status 0"
        )
    if evidence.launch_error or evidence.exit_code in (126, 127):
        return bad_command(base, evidence, lines)

    hardware = hardware_evidence(evidence, lines)
    root = root_report(evidence.error_reports)
    specific = specific_from_report(base, root, evidence) if root else None
    if specific is None:
        specific = specific_from_lines(base, lines, evidence)

    if evidence.hang_declared:
        if specific is not None and specific.failure_class is FailureClass.COLLECTIVE_TIMEOUT:
            return specific
        if hardware is not None:
            return with_hardware(base, None, hardware, "the job hung")
        return hang(base, evidence, specific)

    if specific is not None:
        # A machine that cannot start CUDA at all (node_fault) is not explained by one GPU.
        if (
            hardware is not None
            and specific.failure_class in (FailureClass.CUDA_ERROR, FailureClass.COLLECTIVE_TIMEOUT)
            and not specific.details.get("node_fault")
        ):
            return with_hardware(base, specific, hardware, specific.why)
        return specific
    if hardware is not None:
        return with_hardware(base, None, hardware, signal_phrase(signum, signal_source))

    by_signal = from_signal(base, evidence, lines, signum, signal_source)
    if by_signal is not None:
        return by_signal
    exception = user_exception(base, root, lines)
    if exception is not None:
        return exception
    if evidence.exit_code == 2 and any(
        USAGE_RE.search(line) or CANT_OPEN_RE.search(line) for line in lines
    ):
        return bad_command(base, evidence, lines)
    code = "unknown" if evidence.exit_code is None else str(evidence.exit_code)
    return base.make(
        FailureClass.UNKNOWN,
        Category.TIMEOUT,
        "low",
        f"exit status {code} with no error message, signal or hang to explain it",
        tail(lines, 5),
    )
