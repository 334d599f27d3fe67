"""A hung distributed job: the rank worth naming, and the evidence it comes from."""

from __future__ import annotations

from trainmedic.resilience.group import RankProgress, first_stopped
from trainmedic.resilience.places import Place, PlaceKind, classify_place
from trainmedic.resilience.silence import classify_job, classify_process
from trainmedic.resilience.silence_evidence import (
    JobEvidence,
    KernelView,
    ProcessEvidence,
    ProcessWindow,
    Silence,
    StackView,
)

BACKWARD = Place(
    ("autograd/graph.py:829 _engine_run_backward", "torch/_tensor.py:630 backward",
     "train.py:30 <module>"),
    ("torch.autograd.graph", "torch._tensor", "__main__"),
    ("Variable", "_execution_engine", "run_backward"),
    "CALL",
)  # fmt: skip
AGENT = Place(
    ("server/api.py:923 _invoke_run", "server/api.py:745 run", "launcher/api.py:374 launch_agent",
     "distributed/run.py:1019 run"),
    ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.agent.server.api",
     "torch.distributed.launcher.api", "torch.distributed.run"),
    ("time", "sleep"),
    "CALL",
)  # fmt: skip
SLEEPING = Place(("train.py:26 <module>",), ("__main__",), ("time", "sleep"), "CALL")
IDLE = KernelView(span_s=1.0, cpu_s=0.0, state="S", syscall="futex")


def win(pid: int, place: Place, rank: int | None, role: str = "process") -> ProcessWindow:
    return ProcessWindow(pid, role, rank, True, IDLE, StackView(place=place, samples=4))


def test_torchrun_s_agent_sleeping_is_not_in_a_collective() -> None:
    assert classify_place(AGENT) is PlaceKind.SLEEP


def test_a_rank_waiting_in_ddp_backward_waits_on_a_peer() -> None:
    e = classify_process(win(11, BACKWARD, rank=0))
    assert e.silence is Silence.PEER_WAIT
    assert "all-reduce" in e.why
    # Without a rank (no distributed job) an idle backward is not called a peer wait.
    assert classify_process(win(11, BACKWARD, rank=None)).silence is not Silence.PEER_WAIT
    # On the CPU, a backward is computing.
    busy = ProcessWindow(11, "process", 0, True, KernelView(span_s=1.0, cpu_s=0.9, state="R"),
                         StackView(place=BACKWARD, samples=4))  # fmt: skip
    assert classify_process(busy).silence is Silence.WORK


def test_the_culprit_is_the_blocked_rank_not_the_agent_or_the_waiting_rank() -> None:
    job = classify_job([win(10, AGENT, None), win(11, BACKWARD, 0), win(12, SLEEPING, 1)])
    assert job.silence is Silence.BLOCKED
    assert job.culprit is not None and job.culprit.rank == 1
    assert job.why.startswith("rank 1 12")


def test_every_rank_in_a_collective_is_a_peer_wait_whatever_the_agent_does() -> None:
    job = classify_job([win(10, AGENT, None), win(11, BACKWARD, 0), win(12, BACKWARD, 1)])
    assert job.silence is Silence.PEER_WAIT


def _evidence(*processes: ProcessEvidence) -> JobEvidence:
    return JobEvidence(Silence.PEER_WAIT, "", processes[0], tuple(processes))


def test_first_stopped_is_the_rank_not_in_a_collective() -> None:
    evidence = _evidence(
        ProcessEvidence(11, "process", 0, Silence.PEER_WAIT, "waits"),
        ProcessEvidence(12, "process", 1, Silence.BLOCKED, "off the CPU"),
        ProcessEvidence(13, "process", 2, Silence.PEER_WAIT, "waits"),
    )
    progress = {r: RankProgress(r, 11 + r, 30, 100.0) for r in range(3)}
    stopped = first_stopped(evidence, progress)
    assert stopped is not None and stopped.rank == 1 and stopped.pid == 12
    assert stopped.why.startswith("not in a collective")


def test_a_stuck_dataloader_worker_names_its_rank() -> None:
    evidence = _evidence(
        ProcessEvidence(11, "process", 0, Silence.PEER_WAIT, "waits"),
        ProcessEvidence(12, "process", 1, Silence.BLOCKED, "waits for workers"),
        ProcessEvidence(21, "worker", 1, Silence.SOURCE_WAIT, "waits on a socket"),
    )
    stopped = first_stopped(evidence, {})
    assert stopped is not None and stopped.rank == 1 and stopped.pid == 12


def test_all_in_collectives_the_oldest_last_step_is_named() -> None:
    evidence = _evidence(
        ProcessEvidence(11, "process", 0, Silence.PEER_WAIT, "waits"),
        ProcessEvidence(12, "process", 1, Silence.PEER_WAIT, "waits"),
    )
    progress = {0: RankProgress(0, 11, 41, 200.0), 1: RankProgress(1, 12, 40, 196.0)}
    stopped = first_stopped(evidence, progress)
    assert stopped is not None and stopped.rank == 1
    assert "40 step(s)" in stopped.why


def test_ranks_stopped_together_name_nobody() -> None:
    evidence = _evidence(
        ProcessEvidence(11, "process", 0, Silence.PEER_WAIT, "waits"),
        ProcessEvidence(12, "process", 1, Silence.PEER_WAIT, "waits"),
    )
    progress = {0: RankProgress(0, 11, 40, 200.0), 1: RankProgress(1, 12, 40, 200.01)}
    assert first_stopped(evidence, progress) is None
    assert first_stopped(None, {0: RankProgress(0, 11, 40, 200.0)}) is None
