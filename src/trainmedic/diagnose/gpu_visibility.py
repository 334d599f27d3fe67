"""What the run could not see on its GPUs (info): MIG mode, unreadable process lists.

Other rules stay silent where a reading is missing (no utilization, no
process list); this rule says why, so silence is not taken for health. The
findings are doctor's (:mod:`trainmedic.findings.gpu_faults`).
"""

from __future__ import annotations

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.gpu_faults import mig_finding, processes_unknown_finding
from trainmedic.findings.model import Finding


def gpu_visibility(view: RunView, th: Thresholds) -> list[Finding]:
    findings: list[Finding] = []
    indices = view.job_gpu_indices or tuple(sorted({g.index for g in view.record.gpu}))
    for index in indices:
        series = [g for g in view.gpu_series(index, steady_only=False) if g.unreachable is None]
        if not series:
            continue
        mig = [g for g in series if g.mig_mode]
        unknown = [g for g in series if g.known_processes is None]
        if mig:
            findings.append(mig_finding(mig[-1], "during the run"))
        elif unknown:
            findings.append(processes_unknown_finding(unknown[-1], "during the run"))
    return findings
