"""Keeping a job alive: why an attempt ended, when a job is hung, whether and
how to restart it.

Pure logic with no processes, clocks or I/O of its own (the error-file reader
aside): the supervisor (:mod:`trainmedic.supervise`) observes, these modules
decide, the supervisor acts. docs/restarts.md describes the rules and numbers.

- :mod:`.classify` — :func:`classify_failure`: evidence -> :class:`FailureClass`.
- :mod:`.timeouts` — :class:`StepTimeout`: the adaptive step timeout.
- :mod:`.policy` — :class:`RestartPolicy` from composable stop/retry/wait strategies.
- :mod:`.remedies` — :func:`plan_remedies`: environment changes for the next attempt.
- :mod:`.errorfile` — the error file a dying process writes.
"""

from trainmedic.resilience.classify import (
    Classification,
    FailureClass,
    FailureEvidence,
    GpuFault,
    GpuRef,
    classification_to_finding,
    classify_failure,
)
from trainmedic.resilience.errorfile import ErrorReport, read_error_reports
from trainmedic.resilience.policy import (
    AttemptRecord,
    Decision,
    RestartPolicy,
    RestartState,
    default_policy,
)
from trainmedic.resilience.remedies import Remedy, apply_remedies, plan_remedies
from trainmedic.resilience.timeouts import StepTimeout, TimeoutConfig, TimeoutVerdict

__all__ = [
    "AttemptRecord",
    "Classification",
    "Decision",
    "ErrorReport",
    "FailureClass",
    "FailureEvidence",
    "GpuFault",
    "GpuRef",
    "Remedy",
    "RestartPolicy",
    "RestartState",
    "StepTimeout",
    "TimeoutConfig",
    "TimeoutVerdict",
    "apply_remedies",
    "classification_to_finding",
    "classify_failure",
    "default_policy",
    "plan_remedies",
    "read_error_reports",
]
