"""The kinds of :class:`~trainmedic.record.types.RunEvent`: every event a run records.

A kind is written as its value (``"xid"``) in ``events.jsonl`` and on the
probe's channel; the enum is a ``str``, so a kind compares equal to its value.
A record written by another version may hold a kind this one does not know:
it reads back as :attr:`EventKind.UNKNOWN`, its name kept in the event's data
(``unknown_kind``), so reports still list it.
"""

from __future__ import annotations

from enum import Enum


class EventKind(str, Enum):
    """What happened, once. Grouped by who records it."""

    # The job's processes (the supervisor's process table, the probe's hello).
    JOB_START = "job_start"
    """An attempt's job was launched (data: attempt, pid)."""
    PROCESS_START = "process_start"
    """A process of the job started its probe (data: role, rank, ...)."""
    PROCESS_ROLE = "process_role"
    """A known process said what it is (a DataLoader worker, a rank)."""
    PROCESS_EXIT = "process_exit"
    """A process of the job ended (data: exit code or signal)."""
    PROCESS_CENSUS = "process_census"
    """The job's process tree counted: which processes carry a probe."""
    LEFTOVERS_STOPPED = "leftovers_stopped"
    """Processes the attempt left behind were stopped before the next one."""

    # Failures, hangs and restarts (the supervisor's attempt loop).
    EXCEPTION = "exception"
    """An uncaught exception in the training process (data: traceback)."""
    THREAD_EXCEPTION = "thread_exception"
    """An uncaught exception in another thread of a job's process."""
    HANG_DETECTED = "hang_detected"
    """The watchdog found no progress for the timeout (data: stacks, cause)."""
    ATTEMPT_END = "attempt_end"
    """An attempt ended: how, its classification, the restart decision."""
    OOM = "oom"
    """An out-of-memory failure (GPU or host) recorded as such."""
    XID = "xid"
    """A GPU reported an Xid error (data: gpu, xid, meaning)."""
    REMEDY = "remedy"
    """The attempt loop changed something before a restart (a smaller batch...)."""
    CHECKPOINT_RESUMED = "checkpoint_resumed"
    """The job loaded a checkpoint (data: step, path)."""

    # Remedies applied inside the job (--apply-from).
    REMEDY_APPLIED = "remedy_applied"
    """A planned change was applied in the job."""
    REMEDY_NOT_APPLIED = "remedy_not_applied"
    """A planned change could not be applied (data: why)."""
    REMEDY_OVERRIDDEN = "remedy_overridden"
    """The job set the value itself after the change."""
    REMEDY_REVERTED = "remedy_reverted"
    """A change was taken back (it broke or slowed the job)."""

    # Remedies working inside the job (trainmedic.remedies' wrappers).
    SAMPLE_RETRIED = "sample_retried"
    """A data sample loaded after retries (ResilientDataset)."""
    SAMPLE_SKIPPED = "sample_skipped"
    """A data sample that kept failing was skipped (ResilientDataset)."""
    MICRO_BATCH = "micro_batch"
    """Automatic micro-batching split or regrew the batch after an out-of-memory."""

    # What the probe found about the job's framework.
    PROBE_DEGRADED = "probe_degraded"
    """A measurement is unavailable in this job (an API missing, ...)."""
    PROBE_ERROR = "probe_error"
    """A probe part was disabled after an internal error."""
    PROBE_DROPPED = "probe_dropped"
    """The probe dropped messages the supervisor did not take in time."""
    GRAD_SCALER = "grad_scaler"
    """Mixed precision's GradScaler skipped optimizer steps."""
    PROFILE_WINDOW = "profile_window"
    """A torch.profiler window was written (data: path, steps)."""
    TF_GPU = "tf_gpu"
    """TensorFlow's GPU memory settings and pool."""
    TFDATA_PIPELINE = "tfdata_pipeline"
    """A tf.data pipeline's stages, as the probe read them."""
    TFDATA_EPOCHS = "tfdata_epochs"
    """A tf.data pipeline started a second epoch (how: cached, re-read)."""

    # trainmedic's own troubles (the job runs on regardless).
    SAMPLER_ERROR = "sampler_error"
    """A supervisor sampler failed and was stopped."""
    CHANNEL_ERROR = "channel_error"
    """A message from the probe could not be read."""
    KEEPER_ERROR = "keeper_error"
    """The output keeper (the job's stdout/stderr copy) failed."""
    SUPERVISOR_ERROR = "supervisor_error"
    """The supervisor itself failed; the job went on without it."""
    STACKS_OUTSIDE = "stacks_outside"
    """A training process's stacks sampled by the supervisor from outside (py-spy): it
    began, handed back to the probe's own sampler, could not, and what it cost."""
    SUPERVISOR_USAGE = "supervisor_usage"
    """The supervisor's own CPU and memory over the run."""
    RECORD_CAPPED = "record_capped"
    """The record reached its size cap; later events were counted, not kept."""

    UNKNOWN = "unknown"
    """A kind written by another version of trainmedic (its name in ``unknown_kind``)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str) -> EventKind | None:
        """The kind named ``value``; ``None`` when this version does not know it."""
        try:
            return cls(value)
        except ValueError:
            return None
