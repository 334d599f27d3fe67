"""The demo's fault scenarios: a job that hangs, crashes or runs out of memory once.

Each runs ``train_faulty.py`` under ``trainmedic run`` with a short fixed
timeout and no backoff, so detection, forensics, the restart and the resume
all show within a minute. :func:`judge` reads the attempts back from the run
record and says whether trainmedic did what the scenario promises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmedic.resilience.incidents import AttemptSummary

SCRIPT = Path(__file__).resolve().parent / "train_faulty.py"
"""The faulty training script; it knows trainmedic only through its public API
(Checkpointer, micro_batch_plan)."""


@dataclass(frozen=True)
class ResilienceScenario:
    """One fault and what ``trainmedic run`` should do about it.

    Attributes:
        fault: ``train_faulty.py --fault``.
        failure_class: how the first attempt should be classified.
        remedy: the remedy the restart should carry, if any.
        timeout_s: ``--timeout`` (short, so the demo is quick).
    """

    name: str
    story: str
    fault: str
    failure_class: str
    remedy: str | None = None
    steps: int = 60
    at: int = 30
    timeout_s: float = 3.0

    def script_args(self) -> list[str]:
        return ["--fault", self.fault, "--steps", str(self.steps), "--at", str(self.at)]

    def run_options(self) -> dict[str, object]:
        """Keyword values for the ``run`` command."""
        return {"timeout_s": self.timeout_s, "max_restarts": 2, "backoff_s": 0.0, "grace_s": 2.0}

    @property
    def expectation(self) -> str:
        remedy = f", remedy {self.remedy}" if self.remedy else ""
        return f"{self.failure_class} detected, restarted{remedy}, resumed, exit 0"


RESILIENCE_SCENARIOS: dict[str, ResilienceScenario] = {
    s.name: s
    for s in (
        ResilienceScenario(
            name="hang",
            story=(
                "At step 30 the training loop waits for a peer that never answers (a lock "
                "nobody releases), as a lost collective would. No step for 3 s: trainmedic "
                "saves every thread's stack, stops the job and restarts it, and the "
                "Checkpointer resumes from step 30."
            ),
            fault="hang",
            failure_class="hang",
        ),
        ResilienceScenario(
            name="crash",
            story=(
                "At step 30 the job dies of a segmentation fault in native code. trainmedic "
                "classifies the signal, restarts the job, and it resumes from its last "
                "checkpoint."
            ),
            fault="crash",
            failure_class="segfault",
        ),
        ResilienceScenario(
            name="oom",
            story=(
                "The job models a GPU with room for 32 samples per micro-batch and asks for "
                "64: torch's CUDA out-of-memory error. trainmedic restarts it with "
                "TRAINMEDIC_MICRO_BATCH_DIVISOR=2, and trainmedic.micro_batch_plan() trains "
                "on 32 x 2 with gradient accumulation: the same effective batch."
            ),
            fault="oom",
            failure_class="cuda_oom",
            remedy="micro_batch",
        ),
    )
}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


def judge(s: ResilienceScenario, attempts: Sequence[AttemptSummary], exit_code: int) -> Verdict:
    """Whether the run did what the scenario promises, in one line either way."""
    classes = [a.failure_class for a in attempts]
    if not attempts:
        return Verdict(False, "no attempt was recorded")
    first, last = attempts[0], attempts[-1]
    if first.failure_class != s.failure_class:
        return Verdict(False, f"expected {s.failure_class} first, got {' -> '.join(classes)}")
    if not last.succeeded or exit_code != 0:
        return Verdict(False, f"the job did not finish: {' -> '.join(classes)}")
    remedies = [str(r.get("name")) for r in first.remedies]
    if s.remedy is not None and s.remedy not in remedies:
        return Verdict(False, f"expected the {s.remedy} remedy, got {remedies or 'none'}")
    parts = [f"{s.failure_class} in attempt 1"]
    if first.hang is not None:
        detected = first.hang.get("detected_after_s")
        parts.append(f"detected {detected} s after the last step")
        parts.append(str(first.hang.get("summary")))
    if remedies:
        parts.append(f"restarted with {', '.join(remedies)}")
    else:
        parts.append("restarted")
    if last.resume_step:
        parts.append(f"resumed from step {last.resume_step}")
    return Verdict(True, "; ".join(parts) + f"; finished after {len(attempts)} attempts")
