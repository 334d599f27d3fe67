"""A loop without a DataLoader waiting on other threads or processes: the wait followed
to what they do (trainmedic.diagnose.handoff, handoff_causes)."""

from __future__ import annotations

import math

import pytest

from support.builders import (
    make_activity,
    make_handoff,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.handoff import measure_handoff, size_handoff
from trainmedic.diagnose.input_bound import input_bound
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.types import LoaderActivity, RunRecord

TH = Thresholds()
STEP, WAIT, BATCH = 0.146, 0.122, 16


def handoff_record(
    *activity: LoaderActivity,
    cores: float = 2.0,
    job: float = 30.0,
    others: float = 0.0,
    step: float = STEP,
    wait: float = WAIT,
    **host: float,
) -> RunRecord:
    """100 steps of ``step`` s, ``wait`` s of it outside the step, 16 samples each, on
    ``cores`` usable cores; no DataLoader."""
    return make_record(
        make_steps(100, step, wait, samples=BATCH),
        host=make_host_series(16, usable_cores=cores, job_cpu_pct=job, others_cpu_pct=others,
                              **host),
        activity=activity,
    )  # fmt: skip


def first(record: RunRecord) -> Finding:
    findings = diagnose_run(record, strict=True)  # every finding consistent, or it raises
    return findings[0]


def test_threads_waiting_on_sockets_are_network_sized_by_littles_law() -> None:
    # The case: a pool of 4 threads fetching from a store that answers after
    # ~30 ms; the training thread only waits on the futures.
    f = first(handoff_record(make_handoff(waits=84, threads={"socket": 330, "idle": 6})))
    assert (f.id, f.category, f.severity) == ("input.network", Category.NETWORK, Severity.ERROR)
    ev = f.evidence
    assert ev["helpers"] == "threads" and ev["helper_threads_seen"] == pytest.approx(4.0)
    # 330/84 = 3.93 requests in flight while waiting; per sample 3.93 x 0.146 / 16 = 36 ms
    # (30 ms if the helpers idle while the step computes)
    assert ev["samples_in_flight_now"] == pytest.approx(3.93, abs=0.01)
    assert ev["sample_latency_ms"] == pytest.approx(35.9, abs=0.2)
    assert ev["sample_latency_low_ms"] == pytest.approx(30.0, abs=0.2)
    # needed: 1.25 x 3.93 x 0.146 / 0.024 -> 30, well beyond the 2 cores, in threads
    assert ev["samples_in_flight_needed"] == math.ceil(1.25 * 330 / 84 * STEP / (STEP - WAIT))
    assert ev["recommended_threads"] == ev["samples_in_flight_needed"] > 2
    assert ev["latency_bound"] is True
    assert "ThreadPoolExecutor(max_workers=30)" in f.fix
    # No DataLoader there: no DataLoader settings, nothing for --apply-from.
    assert "num_workers" not in f.fix and "DataLoader" not in f.fix and f.apply is None
    # The speed-up follows from the 84 % wait: the step's own compute bounds it.
    assert ev["speedup_limited_by"] == "compute"
    assert ev["predicted_speedup"] == pytest.approx(STEP / (STEP - WAIT), rel=0.02)


def test_an_event_loop_polling_its_connections_is_network_in_requests_not_threads() -> None:
    f = first(handoff_record(make_handoff(waits=70, threads={"socket": 70}, in_flight=280)))
    assert (f.id, f.category) == ("input.network", Category.NETWORK)
    assert "an event loop" in f.title
    assert f.evidence["samples_in_flight_now"] == pytest.approx(4.0)
    assert f.evidence["recommended_concurrent_requests"] > 4
    assert "asyncio.Semaphore" in f.fix


def test_producer_processes_on_sockets_get_threads_inside_them() -> None:
    f = first(handoff_record(make_handoff(waits=72, processes={"socket": 143, "cpu": 1})))
    assert (f.id, f.category) == ("input.network", Category.NETWORK)
    ev = f.evidence
    assert ev["helpers"] == "processes" and ev["helper_processes_seen"] == pytest.approx(2.0)
    assert ev["recommended_threads_per_process"] * 2 >= ev["samples_in_flight_needed"]
    assert "inside each of the 2 producer processes" in f.fix


def test_a_thread_reading_files_is_io() -> None:
    f = first(handoff_record(make_handoff(waits=66, threads={"file": 55, "python": 10, "cpu": 1})))
    assert (f.id, f.category) == ("input.io", Category.IO)
    assert "ThreadPoolExecutor" in f.fix and "NVMe" in f.fix


def test_threads_computing_in_python_are_not_network_but_the_interpreter_lock() -> None:
    # Fooling the rule: the same pool, computing. One runs at a time; a core is spare.
    f = first(handoff_record(make_handoff(waits=44, threads={"python": 44, "idle": 132})))
    assert (f.id, f.category) == ("input.gil", Category.FRAMEWORK_CONFIG)
    assert f.evidence["helper_resource"] == "cpu"
    assert "ProcessPoolExecutor(max_workers=2)" in f.fix and "interpreter lock" in f.fix
    # Python under one lock does one core's work: processes could use both cores.
    assert f.evidence["speedup_limited_by"] == "cpu"
    assert 1.5 < f.evidence["predicted_speedup"] < 2.1


def test_waits_already_answered_count_as_waits_but_not_as_idle_helpers() -> None:
    # An event loop computing each batch in under the interpreter's switch interval: the
    # sampler gets the lock when the loop hands the batch over, the future done. Those
    # samples are the loop's wait, and say nothing of what the helpers did in it.
    record = handoff_record(make_handoff(waits=80, answered=50, threads={"python": 28, "wait": 2}))
    h = measure_handoff(RunView.of(record), TH)
    assert h is not None and (h.waits, h.answered, h.wait_samples) == (30, 50, 80)
    f = first(record)
    assert (f.id, f.category) == ("input.gil", Category.FRAMEWORK_CONFIG)
    assert f.evidence["handoff_waits"] == 80 and f.evidence["handoff_answered_waits"] == 50
    assert f.evidence["helper_threads_seen"] == pytest.approx(1.0)  # per moment looked at
    assert f.evidence["helper_python_share"] == pytest.approx(28 / 30, abs=1e-3)
    # Counted as moments the helper waited, they would hide its work.
    unanswered = first(handoff_record(make_handoff(waits=80, threads={"python": 28, "wait": 52})))
    assert unanswered.evidence["helper_python_share"] == pytest.approx(28 / 80, abs=1e-3)


def test_helpers_computing_with_every_core_busy_are_cpu() -> None:
    # Three producer processes on the 2 cores, all computing while the loop waits.
    f = first(handoff_record(make_handoff(waits=44, processes={"cpu": 132})))
    assert (f.id, f.category) == ("input.cpu", Category.CPU)
    assert "the cores are full" in f.fix and "num_workers" not in f.fix
    # Threads in Python on a 1-core machine: the one core is theirs, processes gain nothing.
    f = first(handoff_record(make_handoff(waits=44, threads={"python": 44}), cores=1.0))
    assert (f.id, f.category) == ("input.cpu", Category.CPU)
    assert "interpreter lock" in f.fix


def test_producer_processes_computing_with_a_core_spare_want_more_of_them() -> None:
    f = first(handoff_record(make_handoff(waits=55, processes={"cpu": 110}), cores=4.0))
    assert (f.id, f.category) == ("input.workers", Category.FRAMEWORK_CONFIG)
    assert f.evidence["recommended_processes"] >= 3


def test_helpers_starved_by_others_are_contention_not_their_work() -> None:
    record = handoff_record(
        make_handoff(waits=44, threads={"python": 44}), others=150.0, train_cpu_cores=0.3,
        train_wait_cores=0.4, helper_cpu_cores=0.3, helper_wait_cores=0.3,
        loader_cpu_cores=0.0, loader_wait_cores=0.0, train_threads=1,
    )  # fmt: skip
    assert first(record).id == "input.contention"
    # ...but helpers waiting on the network wait on it whoever takes the CPU.
    record = handoff_record(
        make_handoff(waits=84, threads={"socket": 330}), others=150.0, train_cpu_cores=0.3,
        train_wait_cores=0.4, helper_cpu_cores=0.1, helper_wait_cores=0.0,
        loader_cpu_cores=0.0, loader_wait_cores=0.0, train_threads=1,
    )  # fmt: skip
    assert first(record).id == "input.network"


@pytest.mark.parametrize(
    ("activity", "why"),
    [
        # too few moments of the wait sampled
        (make_handoff(waits=18, threads={"socket": 72}, own={"transform": 3}), "too few"),
        # they hardly work: the work is elsewhere (a server outside the job)
        (make_handoff(waits=80, threads={"idle": 300, "socket": 5}), "mostly idle"),
        (make_handoff(waits=25, threads={"socket": 12, "idle": 13}), "mostly idle"),
        # their work is split: no resource for sure
        (make_handoff(waits=60, threads={"socket": 60, "python": 60, "file": 50}), "split"),
    ],
)
def test_what_cannot_be_settled_is_information_with_what_settles_it(
    activity: LoaderActivity, why: str
) -> None:
    findings = diagnose_run(handoff_record(activity), strict=True)
    (f,) = [f for f in findings if f.id.startswith("input.")]
    assert (f.id, f.severity) == ("input.handoff", Severity.INFO)
    assert why in f.title
    assert f.evidence["settled"] is False and "Not settled" in f.fix
    assert "DataLoader" not in f.fix
    # an open question about 84 % of the time is no healthy run
    assert "run.healthy" not in [g.id for g in findings]


def test_no_share_is_reported_from_a_handful_of_samples() -> None:
    view = RunView.of(handoff_record(make_handoff(waits=25, threads={"socket": 15})))
    (f,) = input_bound(view, TH)
    assert f.evidence["helper_observations"] == 15
    assert f.evidence["helper_observations_needed"] == TH.activity_min_samples
    assert not [k for k in f.evidence if k.startswith("helper_") and k.endswith("_share")]


def test_a_loop_that_builds_its_batches_itself_is_not_a_handoff() -> None:
    # Waits on others are a minority of its data samples: the loop's own work decides.
    own = {"transform": 150}
    record = handoff_record(make_handoff(waits=20, threads={"socket": 40}, own=own))
    view = RunView.of(record)
    assert measure_handoff(view, TH) is not None
    (f,) = input_bound(view, TH)
    assert f.id == "input.workers" and "Dataset" in f.fix


def test_a_dataloader_bound_job_keeps_its_finding() -> None:
    # Fooling the hand-off rule from the other side: a real DataLoader with no workers.
    record = make_record(
        make_steps(100, 0.25, 0.15, samples=64),
        host=make_host_series(30, usable_cores=16.0, job_cpu_pct=100.0),
        loaders=[make_loader(0)],
        activity=[make_activity(transform=60, file_read=30)],
    )
    f = first(record)
    assert (f.id, f.category) == ("input.workers", Category.FRAMEWORK_CONFIG)
    assert "num_workers=" in f.fix


def test_sizing_reads_the_measured_wait_and_cores() -> None:
    view = RunView.of(handoff_record(make_handoff(waits=84, threads={"socket": 330, "idle": 6})))
    h = measure_handoff(view, TH)
    assert h is not None and h.settled(TH) and h.resource(TH) == "network"
    sizing = size_handoff(view, TH, h)
    assert sizing is not None
    assert sizing.wait_s == pytest.approx(WAIT) and sizing.compute_s == pytest.approx(STEP - WAIT)
    assert sizing.rate_needed == pytest.approx(BATCH / (STEP - WAIT))
    # No CPU seen in 336 observations: its upper bound, a few ms a step, not zero.
    assert 0 < sizing.cpu_s < sizing.compute_s


# --- a data server on this machine at the far end of the helpers' sockets ------------------


def test_a_local_server_that_computes_each_answer_is_its_cpu_not_the_network() -> None:
    # The pool's 4 threads sit in socket reads, and the store answering them is on a CPU
    # whenever they wait (1.3 threads at a time): more requests in flight would queue.
    f = first(handoff_record(make_handoff(
        waits=84, threads={"socket": 330, "idle": 6}, server={"cpu": 84}, server_running=109,
    ), others=65.0))  # fmt: skip
    assert (f.id, f.category) == ("input.server_cpu", Category.CPU)
    ev = f.evidence
    assert ev["data_server_pid"] == 4242 and ev["data_server"] == "python store.py --port 7000"
    assert ev["server_resource"] == "cpu" and ev["server_cpu_share"] == 1.0
    assert ev["server_threads_on_cpu"] == pytest.approx(109 / 84, abs=0.01)
    assert "pid 4242: python store.py" in f.fix
    assert "ThreadPoolExecutor" not in f.fix and "samples in flight" not in f.fix
    assert "interpreter lock" in f.fix  # a Python server near one core
    # Its CPU per step: 1.3 cores x the 122 ms wait, on the 2 cores (the host's "others"
    # are the server itself here): the step can only come down to that.
    server_s = 109 / 84 * WAIT
    assert ev["server_cpu_ms_per_step"] == pytest.approx(server_s * 1000, rel=0.01)
    assert ev["predicted_step_s"] == pytest.approx((server_s + STEP - WAIT) / 2.0, rel=0.02)
    assert ev["speedup_limited_by"] == "cpu"


def test_a_computing_server_with_the_cores_full_wants_cheaper_answers() -> None:
    f = first(handoff_record(make_handoff(
        waits=84, threads={"socket": 330}, server={"cpu": 84}, server_running=84,
    ), others=100.0 + 70.0))  # fmt: skip
    # others: the server's core and 0.7 of someone else's, on 2 cores: 0.3 spare
    assert f.id == "input.server_cpu" and f.evidence["server_cores_full"] is True
    assert "cores are full" in f.fix and "processes of it" not in f.fix


@pytest.mark.parametrize(
    ("server", "expected", "category"),
    [
        ({"wait": 80}, "input.network", Category.NETWORK),  # it sleeps: a latency
        ({"file": 70, "wait": 10}, "input.io", Category.IO),  # it reads a disk
        ({"cpu": 8, "wait": 72}, "input.network", Category.NETWORK),  # computes a little
        ({"cpu": 12}, "input.network", Category.NETWORK),  # too few looks to say
    ],
)
def test_a_local_server_that_waits_or_reads_is_latency_not_cpu(
    server: dict[str, int], expected: str, category: Category
) -> None:
    f = first(handoff_record(make_handoff(
        waits=84, threads={"socket": 330}, server=server, server_running=server.get("cpu", 0),
    )))  # fmt: skip
    assert (f.id, f.category) == (expected, category)
    assert "samples in flight" in f.fix
    if sum(server.values()) >= TH.activity_min_samples:
        assert f.evidence["server_resource"] == category.value
        assert "data server on this machine" in f.title


def test_a_server_computing_a_share_of_each_answer_bounds_the_gain_of_more_in_flight() -> None:
    # A third of its looks on a CPU: latency still, but the server's CPU caps the gain.
    f = first(handoff_record(make_handoff(
        waits=84, threads={"socket": 330}, server={"cpu": 28, "wait": 56}, server_running=56,
    ), step=0.146, wait=0.140))  # fmt: skip
    ev = f.evidence
    assert f.id == "input.network" and ev["speedup_limited_by"] == "server"
    assert ev["predicted_step_s"] == pytest.approx(56 / 84 * 0.140 / 2.0, rel=0.02)
    assert "bounded by the data server's CPU" in f.fix
