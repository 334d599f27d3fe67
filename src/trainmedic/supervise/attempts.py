"""The restart loop: attempts of one job until it succeeds or the policy stops.

Observe -> decide -> act, once per attempt:

1. **start** the command (with the remedies and resume arguments of this
   attempt) in its own session; its output goes on through new pumps into
   the same logs; the watchdog begins a new
   :class:`~trainmedic.resilience.timeouts.StepTimeout` (grown by the
   restarts so far);
2. **watch** until the job exits, the watchdog declares a hang — then the
   stacks are taken (:mod:`.forensics`) and the job is stopped
   (:mod:`.stop`) — or the user stops it (Ctrl-C, SIGTERM: the job gets
   the signal and ``--grace`` seconds, then SIGKILL; never a restart);
3. **gather evidence** (:mod:`.evidence`): exit status, stderr tail, error
   files, cgroup OOM kills, kernel log, GPU faults;
4. **decide** with the :class:`~trainmedic.resilience.policy.RestartPolicy`:
   classify, stop or restart, wait, remedies;
5. **record** the attempt as an ``attempt_end`` event
   (:class:`~trainmedic.resilience.incidents.AttemptSummary`) and in
   ``attempts/<n>/attempt.json``; tell the person on stderr;
6. **act**: wait for the GPUs to let go of the old processes' memory
   (bounded), back off (interruptible), and start the next attempt.

Per-attempt files go to ``<run dir>/attempts/<n>/`` (stacks of a hang, the
error files of the attempt's processes, ``attempt.json``); the run record
itself (steps, samples, events, logs) spans all attempts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from trainmedic.checkpoint import CHECKPOINT_DIR_ENV
from trainmedic.findings.model import Finding
from trainmedic.probe.forensics import STACKS_ENV
from trainmedic.record.guard import RecordGuard
from trainmedic.record.types import RunEvent
from trainmedic.resilience.classify import (
    Classification,
    FailureClass,
    FailureEvidence,
    classification_to_finding,
    classify_failure,
)
from trainmedic.resilience.errorfile import ErrorReport
from trainmedic.resilience.group import StoppedRank, first_stopped
from trainmedic.resilience.incidents import (
    HANG_DETECTED,
    REMEDY,
    AttemptSummary,
    attempt_event,
)
from trainmedic.resilience.policy import (
    DEFAULT_MAX_RESTARTS,
    AttemptRecord,
    Decision,
    RestartPolicy,
    RestartState,
    default_policy,
)
from trainmedic.resilience.silence import JobEvidence
from trainmedic.resilience.timeouts import StepTimeout, TimeoutConfig, TimeoutVerdict
from trainmedic.supervise import evidence
from trainmedic.supervise.forensics import HangForensics, capture_hang, find_py_spy
from trainmedic.supervise.keeper import OutputKeeper
from trainmedic.supervise.launcher import (
    CommandNotExecutableError,
    CommandNotFoundError,
    Job,
    SignalForwarder,
    describe_signal,
)
from trainmedic.supervise.output import OutputPump, TerminalMux
from trainmedic.supervise.resume import (
    ResumePoint,
    checkpoint_dir,
    newest_checkpoint,
    resume_arguments,
)
from trainmedic.supervise.stop import StopReport, stop_job
from trainmedic.supervise.watchdog import AttemptObservations, Watchdog

ATTEMPTS_DIR = "attempts"
ATTEMPT_FILE = "attempt.json"
ATTEMPT_ENV = "TRAINMEDIC_ATTEMPT"
"""The attempt number (1, 2, ...), for scripts that want to know."""
POLL_S = 0.25
"""How often the loop checks the job and the watchdog, seconds."""
OUTPUT_DRAIN_S = 1.0
LEFTOVER_GRACE_S = 3.0
PROBE_DRAIN_S = 2.0


@dataclass(frozen=True)
class ResilienceOptions:
    """How ``trainmedic run`` keeps a job alive (the ``run`` command's options).

    Attributes:
        max_restarts: ``--max-restarts``: failures in a row without progress.
        max_total_restarts: ``--max-total-restarts``: restarts in all (``None``: no cap).
        time_budget_s: ``--time-budget``: no restart once the run used this long.
        timeout: the step timeout's settings (``--timeout``, ``--startup-timeout``,
            ``--timeout-floor``).
        explicit_timeout: the user set ``--startup-timeout``, so the watchdog is
            armed even when the probe sees no torch and no steps.
        grace_s: ``--grace``: SIGTERM to SIGKILL, for a hang and for a stop request.
        backoff_s: ``--backoff``: the first restart's wait (doubling after).
        resume_args: ``--resume-args`` parsed (placeholders ``{checkpoint}``, ``{step}``).
        checkpoint_glob: ``--checkpoint-glob``: the script's own checkpoint files.
        retry_on_exception: restart after a Python exception (a bug) too.
        gpu_release_s: longest wait for GPU memory to be released before a restart.
        seed: seed of the backoff jitter (``None``: random).
    """

    max_restarts: int = DEFAULT_MAX_RESTARTS
    max_total_restarts: int | None = None
    time_budget_s: float | None = None
    timeout: TimeoutConfig = field(default_factory=TimeoutConfig)
    explicit_timeout: bool = False
    grace_s: float = 10.0
    backoff_s: float = 5.0
    resume_args: tuple[str, ...] | None = None
    checkpoint_glob: str | None = None
    retry_on_exception: bool = False
    gpu_release_s: float = 30.0
    seed: int | None = None

    def policy(self, sleep: Callable[[float], None]) -> RestartPolicy:
        return default_policy(
            max_restarts=self.max_restarts,
            max_total_s=self.time_budget_s,
            sleep=sleep,
            rng=random.Random(self.seed),
            retry_on_exception=self.retry_on_exception,
            backoff_s=self.backoff_s,
            max_total_restarts=self.max_total_restarts,
        )


@dataclass
class StopRequests(SignalForwarder):
    """The session's signal forwarder, plus what the restart loop must know: a
    stop was asked for (Ctrl-C, SIGTERM, SIGHUP) — so no restart follows, a
    backoff ends at once, and SIGTERM starts the grace period."""

    requested: int | None = None
    requested_at: float | None = None
    wake: threading.Event = field(default_factory=threading.Event)

    def handle(self, signum: int) -> None:
        if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) and self.requested is None:
            self.requested = signum
            self.requested_at = time.monotonic()
            self.wake.set()
        super().handle(signum)


class CurrentJob:
    """The running attempt's job, for observers that outlive an attempt (the host sampler)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.pid = job.pid  # the first attempt's: cgroup and affinity do not change

    def descendants(self) -> list[psutil.Process]:
        return self.job.descendants()


@dataclass(frozen=True)
class LoopResult:
    """How the attempts ended.

    Attributes:
        returncode: the last attempt's return code (negative: signal).
        ended_at: Unix time the last attempt's job ended.
        attempts: every attempt, in order.
        leftovers: pids of processes the attempts left running, stopped.
    """

    returncode: int
    ended_at: float
    attempts: tuple[AttemptSummary, ...]
    leftovers: tuple[int, ...]


@dataclass
class AttemptIO:
    """Where the job's bytes go; shared by every attempt."""

    stdout_fd: int
    stderr_fd: int
    merged: bool
    mux: TerminalMux
    logs: tuple[tuple[int, str], ...]
    """(our fd, log file name) per stream; the last one holds stderr."""
    record_guard: RecordGuard | None = None
    """Stops the logs and attempt files (not the job) when the run directory stops taking writes."""
    keeper: OutputKeeper | None = None
    """Holds a copy of each stream, for a supervisor that gets killed."""


@dataclass
class _Attempt:
    number: int
    argv: tuple[str, ...]
    env: dict[str, str]
    timeout: StepTimeout
    resume: ResumePoint | None
    started_wall: float
    started_mono: float
    job: Job | None = None
    launch_error: str | None = None
    hang: HangForensics | None = None
    verdict: TimeoutVerdict | None = None
    evidence: JobEvidence | None = None
    detected_wall: float | None = None
    first_stopped: StoppedRank | None = None
    stop: StopReport | None = None
    stopped_by_us: bool = False


class AttemptLoop:
    """Runs the attempts of one job; see the module docstring.

    Args:
        argv / cwd: the user's command.
        env: the job's environment (probe variables included).
        run_dir: the run directory.
        options: the resilience settings.
        io: the output plumbing shared by the attempts.
        router_event: adds an event to the run record (and the live view).
        watchdog: the record sink that watches each attempt.
        stops: the signal forwarder (stop requests).
        wait_idle: waits until the probes' connections closed (``ChannelServer.wait_idle``).
        start_observers: called once, with the first attempt's job.
        gpu_backend_kind: ``nvml``, ``simulated`` or ``none``.
    """

    def __init__(
        self,
        *,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str],
        run_dir: Path,
        options: ResilienceOptions,
        io: AttemptIO,
        router_event: Callable[[RunEvent], None],
        watchdog: Watchdog,
        stops: StopRequests,
        wait_idle: Callable[[float], bool],
        start_observers: Callable[[CurrentJob], None],
        gpu_backend_kind: str = "none",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.argv = tuple(argv)
        self.cwd = cwd
        self.env = dict(env)
        self.run_dir = run_dir
        self.options = options
        self.io = io
        self._event = router_event
        self.watchdog = watchdog
        self.stops = stops
        self._wait_idle = wait_idle
        self._start_observers = start_observers
        self._gpu_kind = gpu_backend_kind
        self._clock = clock
        self._wall = wall
        self.policy = options.policy(sleep=self._interruptible_sleep)
        self.current: CurrentJob | None = None
        self._oom = evidence.OomKillCounter()
        self._py_spy = find_py_spy()
        if CHECKPOINT_DIR_ENV not in self.env:
            self.env[CHECKPOINT_DIR_ENV] = str(checkpoint_dir(run_dir, {}).resolve())
        self._checkpoints = Path(self.env[CHECKPOINT_DIR_ENV])

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> LoopResult:
        """Run attempts until the policy stops; the first attempt's launch errors
        (:class:`CommandNotFoundError`, ...) propagate."""
        first_mono = self._clock()
        env = dict(self.env)
        timeout: StepTimeout | None = None
        applied: tuple[str, ...] = ()
        state = RestartState(started_at=first_mono, now=first_mono, env=env)
        summaries: list[AttemptSummary] = []
        leftovers: list[int] = []
        number = 1
        while True:
            attempt = self._begin(number, env, timeout)
            timeout = attempt.timeout
            self._watch(attempt)
            returncode, ended_wall, stray = self._wind_down(attempt)
            leftovers += stray
            obs = self.watchdog.end_attempt()
            c = classify_failure(self._evidence(attempt, returncode, obs))
            steps_reached = _steps_reached(number, obs, attempt.resume)
            record = AttemptRecord(
                number=number,
                classification=c,
                duration_s=self._clock() - attempt.started_mono,
                steps_reached=steps_reached,
                remedies=applied,
                trained_s=_trained_s(obs),
            )
            state = dataclasses.replace(
                state.with_attempt(record, self._clock()),
                env=env,
                gpus=evidence.gpu_refs(self.watchdog.gpu_last.values()),
                torch_version=obs.torch_version,
            )
            decision = self._decide(state, c)
            summary = self._record(attempt, c, decision, obs, returncode, ended_wall)
            summaries.append(summary)
            if not decision.restart:
                return LoopResult(returncode, ended_wall, tuple(summaries), tuple(leftovers))
            self._release_gpus(obs)
            if decision.wait_s > 0:
                self.policy.sleep(decision.wait_s)
            if self.stops.requested is not None:
                # A stop arrived during the backoff: the attempt just recorded is the last.
                return LoopResult(returncode, ended_wall, tuple(summaries), tuple(leftovers))
            env = decision.next_env(env)
            applied = tuple(r.name for r in decision.remedies)
            number += 1

    # --- one attempt ---------------------------------------------------------------------------

    def _begin(self, number: int, env: dict[str, str], previous: StepTimeout | None) -> _Attempt:
        attempt_dir = self._attempt_dir(number)
        resume = None
        argv = self.argv
        if number > 1 and (self.options.resume_args or self.options.checkpoint_glob):
            resume = newest_checkpoint(self._checkpoints, self.options.checkpoint_glob, self.cwd)
            if self.options.resume_args and resume is not None:
                argv = (*argv, *resume_arguments(self.options.resume_args, resume))
                step = "" if resume.step is None else f" (step {resume.step})"
                self._notice(f"attempt {number} resumes from {resume.path}{step}")
            elif self.options.resume_args:
                self._notice(f"attempt {number}: no checkpoint yet, starting from the beginning")
        job_env = {
            **env,
            ATTEMPT_ENV: str(number),
            STACKS_ENV: str((attempt_dir / "stacks.txt").resolve()),
        }
        started_wall, started_mono = self._wall(), self._clock()
        timeout = (
            StepTimeout(self.options.timeout, started_at=started_mono)
            if previous is None
            else previous.for_next_attempt(started_mono)
        )
        attempt = _Attempt(
            number=number,
            argv=argv,
            env=job_env,
            timeout=timeout,
            resume=resume,
            started_wall=started_wall,
            started_mono=started_mono,
        )
        self._log_offsets = [evidence.log_size(self.run_dir / name) for _, name in self.io.logs]
        self._oom_before = self._oom.read()
        try:
            attempt.job = Job.start(
                argv,
                job_env,
                cwd=self.cwd,
                stdout_fd=self.io.stdout_fd,
                stderr_fd=self.io.stderr_fd,
                merge=self.io.merged,
            )
        except (CommandNotFoundError, CommandNotExecutableError, OSError) as exc:
            if number == 1:
                raise
            attempt.launch_error = str(exc)
            self._notice(f"attempt {number} could not start: {exc}")
            self.watchdog.begin_attempt(timeout, 0)  # nothing to observe, nothing stale
            return attempt
        job = attempt.job
        self._event(
            RunEvent(
                t=self._wall(),
                kind="job_start",
                message=f"job started as pid {job.pid}"
                + (f" (attempt {number})" if number > 1 else ""),
                pid=job.pid,
                data={
                    "attempt": number,
                    "argv": list(argv),
                    "resume": None if resume is None else str(resume.path),
                    "timeout_growth": round(timeout.growth, 3),
                },
            )
        )
        self._pumps = [
            OutputPump(
                job.streams[fd],
                fd,
                self.run_dir / name,
                self.io.mux,
                guard=self.io.record_guard,
                keeper=self.io.keeper,
            )
            for fd, name in self.io.logs
        ]
        for p in self._pumps:
            p.start()
        self.stops.attach(job)
        if self.current is None:
            self.current = CurrentJob(job)
            self._start_observers(self.current)
        else:
            self.current.job = job
        self.watchdog.begin_attempt(timeout, job.pid, explicit=self.options.explicit_timeout)
        return attempt

    def _watch(self, attempt: _Attempt) -> None:
        job = attempt.job
        if job is None:
            return
        killed_for_grace = False
        while job.wait(POLL_S) is None:
            now = self._clock()
            stops = self.stops
            if stops.requested is not None:
                if (
                    stops.requested == signal.SIGTERM
                    and not killed_for_grace
                    and stops.requested_at is not None
                    and now - stops.requested_at >= self.options.grace_s
                ):
                    self._notice(
                        f"the job did not exit within {self.options.grace_s:g} s of SIGTERM: "
                        "killing it"
                    )
                    job.signal_group(signal.SIGKILL)
                    killed_for_grace = True
                    attempt.stopped_by_us = True
                continue
            verdict = self.watchdog.check(now)
            if verdict is not None:
                self._hang(attempt, verdict)
                return

    def _hang(self, attempt: _Attempt, verdict: TimeoutVerdict) -> None:
        job = attempt.job
        assert job is not None
        attempt.verdict = verdict
        attempt.evidence = self.watchdog.evidence
        attempt.detected_wall = self._wall()
        directory = self._attempt_dir(attempt.number)
        why = f" — {attempt.evidence.why}" if attempt.evidence is not None else ""
        stopped = first_stopped(attempt.evidence, self.watchdog.rank_progress())
        attempt.first_stopped = stopped
        group = ""
        if stopped is not None:
            group = (
                f"; the group waits on rank {stopped.rank} (pid {stopped.pid}), "
                f"which stopped first: {stopped.why}"
            )
        self._notice(
            f"attempt {attempt.number} is hung: {verdict.reason}{why}{group}; taking stacks "
            "of every process, then stopping the whole job"
        )
        verdict_data = _verdict_data(verdict, attempt.evidence)
        if stopped is not None:
            verdict_data["first_stopped"] = stopped.to_data()
        attempt.hang = capture_hang(
            directory,
            self.watchdog.job_processes(),
            lead_pid=self.watchdog.focus_pid(),
            verdict=verdict_data,
            last_steps=self.watchdog.last_steps(),
            gpu=self.watchdog.gpu_readings(),
            py_spy=self._py_spy,
        )
        self._notice(f"{attempt.hang.summary} (stacks in {directory})")
        self._event(
            RunEvent(
                t=attempt.detected_wall,
                kind=HANG_DETECTED,
                message=f"attempt {attempt.number} {attempt.hang.summary}",
                pid=job.pid,
                data={
                    "attempt": attempt.number,
                    **verdict_data,
                    "location": attempt.hang.location,
                    "directory": str(directory.relative_to(self.run_dir)),
                    "files": list(attempt.hang.files),
                    "notes": list(attempt.hang.notes),
                    "forensics_s": round(attempt.hang.took_s, 3),
                },
            )
        )
        attempt.stopped_by_us = True
        attempt.stop = stop_job(job, self.options.grace_s)
        if attempt.stop.survivors:
            self._notice(f"processes survived SIGKILL: {list(attempt.stop.survivors)}")

    def _wind_down(self, attempt: _Attempt) -> tuple[int, float, list[int]]:
        """Drain output, stop leftovers, read the probes' last messages."""
        job = attempt.job
        if job is None:
            return 127, self._wall(), []
        ended_wall = self._wall()
        returncode = job.returncode if job.returncode is not None else 0
        for p in self._pumps:
            p.join(OUTPUT_DRAIN_S)
        stray = job.reap_leftovers(LEFTOVER_GRACE_S)
        for p in self._pumps:
            p.join(2.0)
        self._wait_idle(PROBE_DRAIN_S)
        if stray:
            self._event(
                RunEvent(
                    t=self._wall(),
                    kind="leftovers_stopped",
                    message=f"stopped {len(stray)} process(es) the job left running",
                    data={"pids": stray, "attempt": attempt.number},
                )
            )
        return returncode, ended_wall, stray

    # --- evidence, decision, record -------------------------------------------------------------

    def _evidence(
        self, attempt: _Attempt, returncode: int, obs: AttemptObservations
    ) -> FailureEvidence:
        directory = self._attempt_dir(attempt.number)
        reports = evidence.collect_error_reports(self.run_dir, directory)
        if attempt.launch_error is not None:
            return FailureEvidence(exit_code=None, launch_error=attempt.launch_error)
        failed = returncode != 0 or attempt.hang is not None
        stderr_name = self.io.logs[-1][1]
        tail = evidence.stderr_tail(self.run_dir / stderr_name, self._log_offsets[-1])
        return FailureEvidence(
            exit_code=returncode,
            stderr_tail=tail,
            error_reports=reports,
            oom_kill_delta=evidence.oom_kill_delta(self._oom_before, self._oom.read()),
            hang_declared=attempt.hang is not None,
            hang_location=attempt.hang.location if attempt.hang is not None else None,
            **_hang_evidence(attempt),
            kernel_log=evidence.read_kernel_log(attempt.started_mono) if failed else (),
            terminated_by_supervisor=attempt.stopped_by_us,
            job_pids=obs.pids,
            num_workers=obs.num_workers,
            gpu_faults=evidence.gpu_faults(self.watchdog.gpu_first, self.watchdog.gpu_last),
            visible_devices=attempt.env.get("CUDA_VISIBLE_DEVICES"),
            device_order=attempt.env.get("CUDA_DEVICE_ORDER"),
            gpus=tuple(self.watchdog.gpu_last.values()),
        )

    def _decide(self, state: RestartState, c: Classification) -> Decision:
        if self.stops.requested is not None and c.failure_class is not FailureClass.SUCCESS:
            name = describe_signal(self.stops.requested)
            return Decision(False, 0.0, f"not restarting: trainmedic received {name}")
        return self.policy.decide(state, c)

    def _record(
        self,
        attempt: _Attempt,
        c: Classification,
        decision: Decision,
        obs: AttemptObservations,
        returncode: int,
        ended_wall: float,
    ) -> AttemptSummary:
        n = attempt.number
        success = c.failure_class is FailureClass.SUCCESS
        finding = None
        if not success:
            finding = _with_detail(
                classification_to_finding(c, attempt=n, action=decision.reason),
                c,
                attempt,
                self._attempt_dir(n),
                self.run_dir,
            )
            self._notice(f"attempt {n} ended: {c.failure_class.value} — {c.why}")
            self._notice(decision.reason)
        remedies = [
            {
                "name": r.name,
                "reason": r.reason,
                "set_env": dict(r.set_env),
                "unset_env": list(r.unset_env),
            }
            for r in decision.remedies
        ]
        if decision.restart:
            for r in decision.remedies:
                self._notice(r.log_line)
                self._event(
                    RunEvent(
                        t=self._wall(),
                        kind=REMEDY,
                        message=r.log_line,
                        data={"attempt": n + 1, "name": r.name, "set_env": dict(r.set_env)},
                    )
                )
        resume_step = obs.resume_step
        if resume_step is None and attempt.resume is not None:
            resume_step = attempt.resume.step
        hang = None
        if attempt.hang is not None and attempt.verdict is not None:
            hang = {
                "summary": attempt.hang.summary,
                "location": attempt.hang.location,
                "directory": str(self._attempt_dir(n).relative_to(self.run_dir)),
                "files": list(attempt.hang.files),
                "bound_s": round(attempt.verdict.bound_s, 3),
                "basis": attempt.verdict.basis,
                "detected_after_s": round(attempt.verdict.quiet_s, 3),
                "reason": attempt.verdict.reason,
                **{k.removeprefix("hang_"): v for k, v in _hang_evidence(attempt).items()},
            }
            if attempt.first_stopped is not None:
                hang["first_stopped"] = attempt.first_stopped.to_data()
        stop = {}
        if attempt.stop is not None:
            s = attempt.stop
            stop = {
                "took_s": round(s.took_s, 3),
                "terminated": list(s.terminated),
                "killed": list(s.killed),
                "survivors": list(s.survivors),
            }
        summary = AttemptSummary(
            number=n,
            started_at=attempt.started_wall,
            ended_at=max(ended_wall, attempt.started_wall),
            failure_class=c.failure_class.value,
            category=c.category.value,
            why=c.why,
            action=decision.reason,
            restarted=decision.restart,
            exit_code=None if attempt.job is None else returncode,
            finding=None if finding is None else finding.to_dict(),
            wait_s=round(decision.wait_s, 3),
            remedies=tuple(remedies),
            steps=obs.steps,
            resume_step=resume_step,
            first_step_start=obs.first_step_start,
            last_step_end=obs.last_step_end,
            hang_started_at=None
            if attempt.verdict is None or attempt.detected_wall is None
            else attempt.detected_wall - attempt.verdict.quiet_s,
            detected_at=attempt.detected_wall,
            hang=hang,
            resumed_from=None if attempt.resume is None else str(attempt.resume.path),
            stop=stop,
        )
        self._event(attempt_event(summary, self._wall()))
        stacks = self._attempt_dir(n) / "stacks.txt"

        def write_files() -> None:
            if stacks.exists() and stacks.stat().st_size == 0:
                stacks.unlink()  # no process was asked for its stacks
            _write_private_json(self._attempt_dir(n) / ATTEMPT_FILE, summary.to_data())

        self._guarded(ATTEMPT_FILE, write_files)
        return summary

    # --- acting between attempts ---------------------------------------------------------------

    def _release_gpus(self, obs: AttemptObservations) -> None:
        if self._gpu_kind == "none" or not obs.pids:
            return
        from trainmedic.supervise.stop import wait_gpu_release

        released, waited = wait_gpu_release(
            obs.pids,
            self.watchdog.gpu_pids,
            self.options.gpu_release_s,
            sleep=self._interruptible_sleep,
        )
        if released is False:
            self._notice(
                f"GPU memory of the last attempt still held after {waited:.0f} s; starting anyway"
            )

    def _interruptible_sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when a stop is requested."""
        if self.stops.requested is None:
            self.stops.wake.wait(max(0.0, seconds))

    # --- helpers ------------------------------------------------------------------------------

    @property
    def pumps(self) -> tuple[OutputPump, ...]:
        """The output pumps of the current attempt."""
        return tuple(getattr(self, "_pumps", ()))

    def _attempt_dir(self, number: int) -> Path:
        directory = self.run_dir / ATTEMPTS_DIR / str(number)

        def make() -> None:
            if not directory.is_dir():
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(directory, 0o700)
                os.chmod(directory.parent, 0o700)

        self._guarded(ATTEMPTS_DIR, make)
        return directory

    def _guarded(self, what: str, write: Callable[[], None]) -> None:
        """A write into the run directory; a full disk stops the record, not the run."""
        guard = self.io.record_guard
        if guard is not None:
            guard.attempt(what, write)
            return
        write()

    def _notice(self, text: str) -> None:
        self.io.mux.notice(text)


# --- pure helpers ---------------------------------------------------------------------------------


def _steps_reached(number: int, obs: AttemptObservations, resume: ResumePoint | None) -> int | None:
    """The furthest step of the run the attempt reached (see ``AttemptRecord``);
    ``None`` when a later attempt's starting step is unknown (its own count of
    steps says nothing about how far the run got)."""
    start = obs.resume_step
    if start is None and resume is not None:
        start = resume.step
    if start is None and number == 1:
        start = 0
    if start is None:
        return None
    return obs.steps + start


def _verdict_data(v: TimeoutVerdict, evidence: JobEvidence | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "reason": v.reason,
        "basis": v.basis,
        "bound_s": round(v.bound_s, 3),
        "silent_s": round(v.silent_s, 3),
        "quiet_s": round(v.quiet_s, 3),
        "extended": v.extended,
        "silence": v.silence,
    }
    if evidence is not None:
        data["evidence"] = evidence.to_data()
    return data


def _hang_evidence(attempt: _Attempt) -> dict[str, Any]:
    """The hang's class, source and deciding evidence (:class:`FailureEvidence` fields)."""
    if attempt.verdict is None:
        return {}
    e = attempt.evidence
    silence = attempt.verdict.silence
    return {
        "hang_silence": silence,
        "hang_source": e.source if e is not None and silence == e.silence.value else None,
        "hang_evidence": e.why if e is not None and silence == e.silence.value else None,
    }


def _trained_s(obs: AttemptObservations) -> float | None:
    if obs.first_step_start is None or obs.last_step_end is None:
        return None
    return max(0.0, obs.last_step_end - obs.first_step_start)


def _with_detail(
    finding: Finding, c: Classification, attempt: _Attempt, directory: Path, run_dir: Path
) -> Finding:
    """Add what a person needs to act: the traceback of a bug, the stacks of a hang."""
    rel = directory.relative_to(run_dir)
    evidence = dict(finding.evidence)
    detail = finding.detail
    if attempt.hang is not None:
        evidence["hang_summary"] = attempt.hang.summary
        evidence["forensics"] = [str(rel / f) for f in attempt.hang.files]
        notes = "; ".join(attempt.hang.notes)
        detail = attempt.hang.summary + (f" ({notes})" if notes else "")
        stopped = attempt.first_stopped
        if stopped is not None:
            # A distributed job hangs as a group: the rank the others wait on.
            evidence["rank"] = stopped.rank
            evidence["first_stopped"] = stopped.to_data()
            detail += (
                f"; the group waited on rank {stopped.rank} (pid {stopped.pid}), which "
                f"stopped first: {stopped.why}"
            )
    else:
        trace = _traceback(c, attempt, directory)
        if trace:
            detail = trace
    return dataclasses.replace(finding, evidence=evidence, detail=detail)


def _traceback(c: Classification, attempt: _Attempt, directory: Path) -> str | None:
    """The root error file's traceback (last 40 lines), for exceptions."""
    from trainmedic.resilience.errorfile import read_error_reports

    reports: list[ErrorReport] = read_error_reports(directory / "errors")
    if not reports:
        return None
    pid = c.details.get("pid")
    chosen = next((r for r in reports if r.pid == pid), reports[0])
    if not chosen.traceback:
        return None
    return "\n".join(chosen.traceback.rstrip().splitlines()[-40:])


def _write_private_json(path: Path, data: Mapping[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(dict(data), f, indent=1, default=repr)
        f.write("\n")
