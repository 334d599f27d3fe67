"""The restart loop: attempts of one job until it succeeds or the policy stops.

Observe -> decide -> act, once per attempt:

1. **start** the command (with the remedies and resume arguments of this
   attempt) in its own session; its output goes on through new pumps into
   the same logs; the watchdog begins a new
   :class:`~trainmedic.resilience.timeouts.StepTimeout` (grown by the
   restarts so far);
2. **watch** until the job exits, the watchdog declares a hang — then the
   stacks are taken (:mod:`..hang.forensics`) and the job is stopped
   (:mod:`..launch.stop`) — or the user stops it (Ctrl-C, SIGTERM: the job gets
   the signal and ``--grace`` seconds, then SIGKILL; never a restart);
3. **gather evidence** (:mod:`.evidence`): exit status, stderr tail, error
   files, cgroup OOM kills, kernel log, GPU faults;
4. **decide** with the :class:`~trainmedic.resilience.policy.RestartPolicy`:
   classify, stop or restart, wait, remedies;
5. **record** the attempt as an ``attempt_end`` event
   (:class:`~trainmedic.resilience.incidents.AttemptSummary`) and in
   ``attempts/<n>/attempt.json`` (:mod:`.attempt_record`); tell the person
   on stderr;
6. **act**: wait for the GPUs to let go of the old processes' memory
   (bounded), back off (interruptible), and start the next attempt.

The loop's place in this cycle is an explicit state
(:class:`~trainmedic.supervise.loop.attempt_state.AttemptState`: starting, running,
stopping, hung, winding down, deciding, backing off, done), held by an
:class:`~trainmedic.supervise.loop.attempt_state.AttemptTracker` that refuses a
transition its table does not allow and tells the live view and the metrics.
The job's launch, its stop and a hang's forensics are seams passed in, so the
loop is tested with a fake job and clock (tests/supervise/test_attempt_loop.py).

Per-attempt files go to ``<run dir>/attempts/<n>/`` (stacks of a hang, the
error files of the attempt's processes, ``attempt.json``); the run record
itself (steps, samples, events, logs) spans all attempts. What the loop is
given and returns (options, output plumbing, stop requests) is in
:mod:`.attempt_setup`; where a later attempt resumes, in :mod:`.resume`.

Why one module of this length: it is one state machine (its states in
:mod:`.attempt_state`); what each step does lives elsewhere (the record of an attempt
in :mod:`.attempt_record`, its inputs in :mod:`.attempt_setup`, the launch, stop and
hang capture passed in).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainmedic.checkpoint import CHECKPOINT_DIR_ENV
from trainmedic.ostext import signal_name
from trainmedic.probe.forensics import STACKS_ENV
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent
from trainmedic.resilience.classify import (
    Classification,
    FailureClass,
    FailureEvidence,
    classify_failure,
)
from trainmedic.resilience.group import first_stopped
from trainmedic.resilience.incidents import REMEDY, AttemptSummary, attempt_event
from trainmedic.resilience.policy import AttemptRecord, Decision, RestartState
from trainmedic.resilience.timeouts import StepTimeout, TimeoutVerdict
from trainmedic.supervise.hang.forensics import HangForensics, capture_hang, find_py_spy
from trainmedic.supervise.hang.watchdog import AttemptObservations, Watchdog
from trainmedic.supervise.launch.launcher import (
    CommandNotExecutableError,
    CommandNotFoundError,
    Job,
)
from trainmedic.supervise.launch.stop import StopReport, stop_job
from trainmedic.supervise.loop import evidence
from trainmedic.supervise.loop.attempt_record import (
    ATTEMPT_FILE,
    ATTEMPTS_DIR,
    STACKS_FILE,
    Attempt,
    finding_for,
    hang_event,
    hang_evidence,
    job_start_event,
    steps_reached,
    summarise,
    trained_s,
    verdict_data,
    write_attempt_file,
)
from trainmedic.supervise.loop.attempt_setup import (
    AttemptIO,
    CurrentJob,
    LoopResult,
    StopRequests,
)
from trainmedic.supervise.loop.attempt_setup import ResilienceOptions as ResilienceOptions
from trainmedic.supervise.loop.attempt_state import AttemptState, AttemptTracker
from trainmedic.supervise.loop.resume import checkpoint_dir, plan_resume
from trainmedic.supervise.output.stream import OutputPump

ATTEMPT_ENV = "TRAINMEDIC_ATTEMPT"
"""The attempt number (1, 2, ...), for scripts that want to know."""
POLL_S = 0.25
"""How often the loop checks the job and the watchdog, seconds."""
OUTPUT_DRAIN_S = 1.0
LEFTOVER_GRACE_S = 3.0
PROBE_DRAIN_S = 2.0


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
        clock / wall: monotonic and Unix seconds.
        tracker: where the loop's state is kept and announced (:mod:`.attempt_state`).
        launch: starts the job (:meth:`Job.start`'s signature).
        stop: stops a hung job's whole tree within a grace (:func:`..launch.stop.stop_job`).
        capture: takes a hang's forensics (:func:`..hang.forensics.capture_hang`).
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
        tracker: AttemptTracker | None = None,
        launch: Callable[..., Job] = Job.start,
        stop: Callable[[Job, float], StopReport] = stop_job,
        capture: Callable[..., HangForensics] = capture_hang,
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
        self.states = tracker if tracker is not None else AttemptTracker(clock=clock)
        self._launch = launch
        self._stop = stop
        self._capture = capture
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
        states = self.states
        while True:
            attempt = self._begin(number, env, timeout)
            timeout = attempt.timeout
            self._watch(attempt)
            states.enter(AttemptState.WINDING_DOWN)
            returncode, ended_wall, stray = self._wind_down(attempt)
            leftovers += stray
            states.enter(AttemptState.DECIDING)
            obs = self.watchdog.end_attempt()
            c = classify_failure(self._evidence(attempt, returncode, obs))
            reached = steps_reached(number, obs, attempt.resume)
            record = AttemptRecord(
                number=number,
                classification=c,
                duration_s=self._clock() - attempt.started_mono,
                steps_reached=reached,
                remedies=applied,
                trained_s=trained_s(obs),
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
                states.enter(AttemptState.DONE)
                return LoopResult(returncode, ended_wall, tuple(summaries), tuple(leftovers))
            states.enter(AttemptState.BACKING_OFF)
            self._release_gpus(obs)
            if decision.wait_s > 0:
                self.policy.sleep(decision.wait_s)
            if self.stops.requested is not None:
                # A stop arrived during the backoff: the attempt just recorded is the last.
                states.enter(AttemptState.DONE)
                return LoopResult(returncode, ended_wall, tuple(summaries), tuple(leftovers))
            env = decision.next_env(env)
            applied = tuple(r.name for r in decision.remedies)
            number += 1

    # --- one attempt ---------------------------------------------------------------------------

    def _begin(self, number: int, env: dict[str, str], previous: StepTimeout | None) -> Attempt:
        """``STARTING``; ``RUNNING`` once the job is launched (a launch error after the
        first attempt leaves it starting, with nothing to watch)."""
        self.states.start(number)
        attempt_dir = self._attempt_dir(number)
        o = self.options
        argv, resume, notice = plan_resume(
            number, self.argv, o.resume_args, o.checkpoint_glob, self._checkpoints, self.cwd
        )
        if notice is not None:
            self._notice(notice)
        job_env = {
            **env,
            ATTEMPT_ENV: str(number),
            STACKS_ENV: str((attempt_dir / STACKS_FILE).resolve()),
        }
        started_wall, started_mono = self._wall(), self._clock()
        timeout = (
            StepTimeout(self.options.timeout, started_at=started_mono)
            if previous is None
            else previous.for_next_attempt(started_mono)
        )
        attempt = Attempt(
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
            attempt.job = self._launch(
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
        self._event(job_start_event(attempt, job.pid, self._wall()))
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
        self.states.enter(AttemptState.RUNNING)
        return attempt

    def _watch(self, attempt: Attempt) -> None:
        job = attempt.job
        if job is None:
            return
        killed_for_grace = False
        while job.wait(POLL_S) is None:
            now = self._clock()
            stops = self.stops
            if stops.requested is not None:
                if self.states.now.state is AttemptState.RUNNING:
                    self.states.enter(AttemptState.STOPPING)
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

    def _hang(self, attempt: Attempt, verdict: TimeoutVerdict) -> None:
        job = attempt.job
        assert job is not None
        self.states.enter(AttemptState.HUNG)
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
        verdict_info = verdict_data(verdict, attempt.evidence)
        if stopped is not None:
            verdict_info["first_stopped"] = stopped.to_data()
        attempt.hang = self._capture(
            directory,
            self.watchdog.job_processes(),
            lead_pid=self.watchdog.focus_pid(),
            verdict=verdict_info,
            last_steps=self.watchdog.last_steps(),
            gpu=self.watchdog.gpu_readings(),
            py_spy=self._py_spy,
        )
        self._notice(f"{attempt.hang.summary} (stacks in {directory})")
        self._event(hang_event(attempt, verdict_info, directory, self.run_dir, job.pid))
        attempt.stopped_by_us = True
        attempt.stop = self._stop(job, self.options.grace_s)
        if attempt.stop.survivors:
            self._notice(f"processes survived SIGKILL: {list(attempt.stop.survivors)}")

    def _wind_down(self, attempt: Attempt) -> tuple[int, float, list[int]]:
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
                    kind=EventKind.LEFTOVERS_STOPPED,
                    message=f"stopped {len(stray)} process(es) the job left running",
                    data={"pids": stray, "attempt": attempt.number},
                )
            )
        return returncode, ended_wall, stray

    # --- evidence, decision, record -------------------------------------------------------------

    def _evidence(
        self, attempt: Attempt, returncode: int, obs: AttemptObservations
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
            **hang_evidence(attempt),
            kernel_log=evidence.read_kernel_log(attempt.started_mono) if failed else (),
            xids=self.watchdog.xid_events(attempt.started_wall) if failed else (),
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
            name = signal_name(self.stops.requested)
            return Decision(False, 0.0, f"not restarting: trainmedic received {name}")
        return self.policy.decide(state, c)

    def _record(
        self,
        attempt: Attempt,
        c: Classification,
        decision: Decision,
        obs: AttemptObservations,
        returncode: int,
        ended_wall: float,
    ) -> AttemptSummary:
        n = attempt.number
        directory = self._attempt_dir(n)
        finding = None
        if c.failure_class is not FailureClass.SUCCESS:
            finding = finding_for(c, attempt, decision.reason, directory, self.run_dir)
            self._notice(f"attempt {n} ended: {c.failure_class.value} — {c.why}")
            self._notice(decision.reason)
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
        summary = summarise(
            attempt,
            c,
            decision,
            obs,
            returncode,
            ended_wall,
            finding=finding,
            directory=directory,
            run_dir=self.run_dir,
        )
        self._event(attempt_event(summary, self._wall()))
        self._guarded(ATTEMPT_FILE, lambda: write_attempt_file(directory, summary))
        return summary

    # --- acting between attempts ---------------------------------------------------------------

    def _release_gpus(self, obs: AttemptObservations) -> None:
        if self._gpu_kind == "none" or not obs.pids:
            return
        from trainmedic.supervise.launch.stop import wait_gpu_release

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
