"""Input-bound training, split by cause; /dev/shm too small."""

from __future__ import annotations

import dataclasses

import pytest

from support.builders import (
    GIB,
    JOB_PID,
    MIB,
    T0,
    make_activity,
    make_event,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_machine,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.data_wait import recommended_workers
from trainmedic.diagnose.input_bound import input_bound
from trainmedic.diagnose.shm import shm_too_small
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.types import RunRecord

TH = Thresholds()


def waiting_record(
    wait: float = 0.15,
    duration: float = 0.25,
    *,
    workers: int = 8,
    activity: dict[str, int] | None = None,
    **host: float,
) -> RunRecord:
    """200 steps of ``duration`` s waiting ``wait`` s each, on a host with 16 usable cores."""
    return make_record(
        make_steps(200, duration, wait),
        host=make_host_series(55, **host),
        loaders=[make_loader(workers)],
        activity=[make_activity(**activity)] if activity else [],
    )


def run_input(record: RunRecord, machine: MachineFacts | None = None) -> list[Finding]:
    return input_bound(RunView.of(record, machine), TH)


def test_zero_workers_with_idle_cores_is_framework_config_with_worker_count() -> None:
    (f,) = run_input(waiting_record(workers=0, job_cpu_pct=100.0))
    assert f.id == "input.workers" and f.category is Category.FRAMEWORK_CONFIG
    assert f.severity is Severity.ERROR
    assert f.impact == pytest.approx(0.6)
    # Sized from the measured cost: 0.15 s of loading per 64-sample step is 2.3 ms a
    # sample; keeping up with the 0.1 s of compute takes 640 samples/s, 1.5 cores.
    assert f.evidence["sample_fetch_ms"] == pytest.approx(2.344, abs=1e-3)
    assert f.evidence["samples_per_s_needed"] == pytest.approx(640.0)
    assert f.evidence["loading_cores_needed"] == pytest.approx(1.5)
    assert "num_workers=2" in f.fix and "pin_memory=True" in f.fix
    assert "persistent_workers=True" in f.fix and "predicted 2.5x faster" in f.fix
    assert f.evidence["num_workers"] == 0 and f.evidence["usable_cores"] == 16.0
    assert f.evidence["data_wait_share"] == pytest.approx(0.6)


def test_file_reads_in_the_main_process_are_io_with_parallel_reads_sized() -> None:
    # num_workers=0 and the stacks read files: the time goes to storage, whatever the
    # setting; the parallelism that hides it comes with the fix.
    (f,) = run_input(waiting_record(workers=0, activity={"file_read": 90, "transform": 10}))
    assert f.id == "input.io" and f.category is Category.IO
    assert "NVMe" in f.fix and "num_workers=" in f.fix
    assert f.evidence["sample_latency_ms"] == pytest.approx(0.9 * 2.344, abs=1e-3)


def test_file_reads_dominating_is_io() -> None:
    (f,) = run_input(waiting_record(activity={"file_read": 70, "transform": 20, "idle": 500}))
    assert f.id == "input.io" and f.category is Category.IO
    assert f.evidence["loader_file_read_share"] == pytest.approx(70 / 90, abs=1e-4)
    assert "NVMe" in f.fix


def test_socket_waits_dominating_is_network() -> None:
    (f,) = run_input(waiting_record(activity={"socket_wait": 60, "transform": 30}))
    assert f.id == "input.network" and f.category is Category.NETWORK
    assert "cache" in f.fix


def test_workers_saturating_the_usable_cores_is_cpu() -> None:
    record = waiting_record(
        workers=15,
        job_cpu_pct=1550.0,
        system_cpu_pct=97.0,
        activity={"transform": 95, "file_read": 5},
    )
    (f,) = run_input(record)
    assert f.id == "input.cpu" and f.category is Category.CPU
    assert f.evidence["job_cpu_cores"] == pytest.approx(15.5)
    assert "DALI" in f.fix and "transforms.v2" in f.fix


def test_cpu_saturation_edge() -> None:
    # Full: less than 15 % of 16 cores (2.4) spare, the job's and others' CPU taken away.
    full = waiting_record(
        workers=8, job_cpu_pct=1370.0, others_cpu_pct=0.0, activity={"transform": 50}
    )
    room = waiting_record(
        workers=8, job_cpu_pct=1350.0, others_cpu_pct=0.0, activity={"transform": 50}
    )
    assert run_input(full)[0].id == "input.cpu"
    assert run_input(room)[0].id == "input.workers"
    idle = waiting_record(workers=8, job_cpu_pct=800.0, activity={"transform": 50})
    assert run_input(idle)[0].id == "input.workers"


def test_others_taking_the_cores_is_contention() -> None:
    record = waiting_record(
        job_cpu_pct=700.0, others_cpu_pct=800.0, system_cpu_pct=95.0, activity={"transform": 80}
    )
    (f,) = run_input(record)
    assert f.id == "input.contention" and f.category is Category.CONTENTION
    assert f.evidence["others_cpu_cores"] == pytest.approx(8.0)


def test_too_few_workers_while_cores_idle_is_framework_config() -> None:
    (f,) = run_input(
        waiting_record(workers=2, job_cpu_pct=300.0, activity={"transform": 80, "file_read": 5})
    )
    # 2 busy workers deliver 256 samples/s, 7.8 ms each; 640/s keep up with the compute.
    assert f.id == "input.workers" and "num_workers=7" in f.fix
    assert f.evidence["loading_cores_needed"] == pytest.approx(4.7, abs=0.05)


def test_without_stack_samples_iowait_points_at_storage() -> None:
    (f,) = run_input(waiting_record(workers=15, iowait_pct=30.0, job_cpu_pct=300.0))
    assert f.id == "input.io" and f.evidence["iowait_pct"] == pytest.approx(30.0)


def test_without_stack_samples_network_receive_points_at_network() -> None:
    (f,) = run_input(waiting_record(workers=15, net_recv_bytes_per_s=200.0 * MIB))
    assert f.id == "input.network"
    assert f.evidence["net_recv_mib_per_s"] == pytest.approx(200.0)


def test_few_stack_samples_do_not_name_a_cause() -> None:
    (f,) = run_input(waiting_record(workers=15, activity={"file_read": 10}, job_cpu_pct=1500.0))
    assert f.id == "input.cpu"


@pytest.mark.parametrize(
    ("wait", "duration", "expected"),
    [
        (0.124, 0.625, None),  # 19.8 %
        (0.125, 0.625, Severity.WARNING),  # exactly 20 %
        (0.124, 0.25, Severity.WARNING),  # 49.6 %
        (0.125, 0.25, Severity.ERROR),  # exactly 50 %
    ],
)
def test_severity_edges(wait: float, duration: float, expected: Severity | None) -> None:
    found = run_input(waiting_record(wait, duration))
    assert [f.severity for f in found] == ([] if expected is None else [expected])


def test_wait_hidden_behind_a_busy_gpu_is_not_input_bound() -> None:
    record = make_record(
        make_steps(200, 0.25, 0.075),
        gpu=make_gpu_series(55, utilization_gpu_pct=95.0),
        loaders=[make_loader(8)],
    )
    assert run_input(record) == []  # 30 % wait, but the GPU is idle only 5 %


def test_wait_with_an_idle_gpu_counts_fully() -> None:
    record = make_record(
        make_steps(200, 0.25, 0.15),
        gpu=make_gpu_series(55, utilization_gpu_pct=35.0),
        loaders=[make_loader(0)],
        host=make_host_series(55),
    )
    (f,) = run_input(record)
    assert f.impact == pytest.approx(0.6) and f.evidence["gpu_utilization_pct"] == 35.0


def test_no_finding_below_min_steady_steps() -> None:
    record = make_record(make_steps(4, 0.25, 0.2), loaders=[make_loader(0)])
    assert run_input(record) == []


def test_recommended_workers_share_cores_between_ranks() -> None:
    steps = make_steps(50, pid=1, rank=0) + make_steps(50, pid=2, rank=1)
    view = RunView.of(make_record(steps, host=make_host_series(6)))
    assert recommended_workers(view, TH) == 7  # 16 cores / 2 ranks - 1 main process
    lone = RunView.of(make_record(make_steps(50), host=make_host_series(6, usable_cores=64.0)))
    assert recommended_workers(lone, TH) == 16  # capped
    tiny = RunView.of(make_record(make_steps(50), host=make_host_series(6, usable_cores=2.0)))
    assert recommended_workers(tiny, TH) == 2


def test_machine_facts_supply_cores_when_host_samples_are_missing() -> None:
    record = make_record(make_steps(200, 0.25, 0.15), loaders=[make_loader(0)])
    (f,) = run_input(record, make_machine(cores=32))
    assert f.evidence["usable_cores"] == 32.0


def test_input_cause_is_the_top_finding_of_the_whole_diagnosis() -> None:
    record = make_record(
        make_steps(200, 0.25, 0.15),
        gpu=make_gpu_series(55, utilization_gpu_pct=30.0, memory_used_bytes=8 * GIB),
        host=make_host_series(55),
        loaders=[make_loader(8)],
        activity=[make_activity(file_read=80, transform=10)],
    )
    findings = diagnose_run(record)
    assert findings[0].id == "input.io"
    assert not any(f.id.startswith("gpu.") for f in findings)  # the idle GPU is the wait


# --- /dev/shm --------------------------------------------------------------------------


def test_bus_error_event_is_shm_exhausted() -> None:
    record = make_record(
        make_steps(20),
        loaders=[make_loader(8)],
        events=[
            make_event(
                "exception",
                "RuntimeError: DataLoader worker (pid 77) is killed "
                "by signal: Bus error. It is possible that dataloader's workers are "
                "out of shared memory.",
            )
        ],
    )
    (f,) = shm_too_small(RunView.of(record), TH)
    assert f.id == "input.shm_exhausted" and f.severity is Severity.ERROR
    assert "--shm-size" in f.fix and f.evidence["shm_events"] == 1


def test_sigbus_exit_with_workers_is_shm_exhausted() -> None:
    record = make_record(make_steps(20), loaders=[make_loader(4)], exit_code=-7)
    assert [f.id for f in shm_too_small(RunView.of(record), TH)] == ["input.shm_exhausted"]
    no_workers = make_record(make_steps(20), loaders=[make_loader(0)], exit_code=-7)
    assert shm_too_small(RunView.of(no_workers), TH) == []


def test_small_shm_with_workers_is_a_warning_and_the_edge_is_quiet() -> None:
    record = make_record(make_steps(20), loaders=[make_loader(8)])
    (f,) = shm_too_small(RunView.of(record, make_machine(shm_total=64 * MIB)), TH)
    assert f.id == "input.shm_small" and f.severity is Severity.WARNING
    assert f.evidence["shm_total_bytes"] == 64 * MIB
    assert shm_too_small(RunView.of(record, make_machine(shm_total=1 * GIB)), TH) == []
    zero = make_record(make_steps(20), loaders=[make_loader(0)])
    assert shm_too_small(RunView.of(zero, make_machine(shm_total=64 * MIB)), TH) == []


def test_job_pid_constant_matches_builders() -> None:
    # the loader, the steps and the GPU processes of the builders are one job
    view = RunView.of(make_record(make_steps(10), loaders=[make_loader(2)]))
    assert view.pids == frozenset({JOB_PID})
    assert view.record.meta.started_at == T0


# --- the resource first, parallelism in the fix -------------------------------------------


def http_record(workers: int, latency_s: float = 0.040, compute_s: float = 0.010) -> RunRecord:
    """32-sample batches fetched over HTTP at ``latency_s`` a sample, on 2 cores."""
    if workers == 0:
        wait = 32 * latency_s
        activity = make_activity(pid=JOB_PID, socket_wait=95, transform=5)
    else:  # workers busy all the time, each fetching one sample after the other
        wait = 32 * latency_s / workers - compute_s
        activity = make_activity(pid=JOB_PID + 1, socket_wait=190, transform=10)
    return make_record(
        make_steps(100, compute_s + wait, wait, samples=32),
        host=make_host_series(30, usable_cores=2.0, job_cpu_pct=30.0),
        loaders=[make_loader(workers, batch_size=32)],
        activity=[activity],
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_latency_bound_loading_is_network_with_samples_in_flight_not_cores(workers: int) -> None:
    (f,) = run_input(http_record(workers))
    assert (f.id, f.category) == ("input.network", Category.NETWORK)
    ev = f.evidence
    # 32 samples per 10 ms of compute need 3,200 samples/s; at 40 ms each that is 128
    # samples in flight (160 with the margin): far more than 2 cores' worth of processes.
    assert ev["samples_per_s_needed"] == pytest.approx(3200.0, rel=0.02)
    assert ev["samples_in_flight_needed"] >= 128
    assert ev["recommended_num_workers"] * ev["recommended_threads_per_worker"] >= 128
    assert ev["recommended_num_workers"] <= 3
    assert "ThreadPoolExecutor" in f.fix and "fit the 2 usable cores" not in f.fix
    assert ev["predicted_speedup"] > 5


def test_a_quick_loader_with_few_workers_needs_no_threads() -> None:
    # 2 ms a sample from local disk, 32 a step, 100 ms of compute: 320/s, 1 in flight.
    (f,) = run_input(
        make_record(
            make_steps(100, 0.164, 0.064, samples=32),
            host=make_host_series(30, usable_cores=8.0, job_cpu_pct=100.0),
            loaders=[make_loader(0, batch_size=32)],
            activity=[make_activity(pid=JOB_PID, file_read=90, transform=10)],
        )
    )
    assert f.id == "input.io" and f.evidence["recommended_threads_per_worker"] == 1
    assert "ThreadPoolExecutor" not in f.fix and "num_workers=" in f.fix


def test_the_wait_inside_stalls_is_left_to_the_stall_rule() -> None:
    # 0.05 s steps without wait, and three 2.5 s stalls waiting for data: 7.5 s of
    # 17.5 s. Counted once, in the stalls; the ordinary steps do not wait.
    durations = [0.05] * 197 + [2.5] * 3
    steps = make_steps(200, durations=durations)
    steps = [
        s.__class__(**{**s.__dict__, "data_wait_s": 2.45 if s.duration_s > 1 else 0.0})
        for s in steps
    ]
    record = make_record(
        steps,
        host=make_host_series(20),
        loaders=[make_loader(4)],
        activity=[make_activity(file_read=80)],
    )
    assert run_input(record) == []
    ids = [f.id for f in diagnose_run(record)]
    assert ids[0] == "stall.io" and not any(i.startswith("input.") for i in ids)


def threads(**kw: float) -> dict[str, float]:
    """Host fields of a job whose training thread and workers were measured."""
    base = {"train_threads": 1, "train_cpu_cores": 0.9, "train_wait_cores": 0.0,
            "train_wait_max_share": 0.0, "helper_cpu_cores": 0.0, "job_threads": 12,
            "job_wait_cores": 0.0}  # fmt: skip
    base.update(kw)
    return base


def test_loaders_starved_by_other_processes_is_contention() -> None:
    record = waiting_record(
        workers=2, usable_cores=2.0, job_cpu_pct=120.0, others_cpu_pct=150.0,
        activity={"transform": 90},
        **threads(loader_cpu_cores=0.4, loader_wait_cores=0.8),
    )  # fmt: skip
    (f,) = run_input(record)
    assert f.id == "input.contention"
    assert f.evidence["loading_cpu_wait_share"] == pytest.approx(2 / 3)


def test_a_cgroup_quota_that_stops_the_loaders_is_cpu() -> None:
    host = make_host_series(55, usable_cores=2.0, job_cpu_pct=190.0, others_cpu_pct=0.0,
                            **threads(loader_cpu_cores=1.0, loader_wait_cores=0.6))  # fmt: skip
    host = [
        h.__class__(**{**h.__dict__, "cgroup_throttled_s": 0.3 * i}) for i, h in enumerate(host)
    ]
    record = make_record(
        make_steps(200, 0.25, 0.15), host=host, loaders=[make_loader(2)],
        activity=[make_activity(transform=90)],
    )  # fmt: skip
    (f,) = run_input(record)
    assert f.id == "input.cpu" and "quota" in f.title
    assert f.evidence["cgroup_throttled_share"] == pytest.approx(0.3)


def test_spinning_openmp_threads_do_not_hide_a_spare_core() -> None:
    # 2 cores, a loop building batches with num_workers=0: the job shows 1.8 cores of
    # CPU, 0.8 of it torch's helper thread spinning while the main thread loads.
    host = make_host_series(55, usable_cores=2.0, job_cpu_pct=180.0, others_cpu_pct=5.0,
                            **threads(train_cpu_cores=1.0, helper_cpu_cores=0.8))  # fmt: skip
    steps = make_steps(200, 0.25, 0.225, compute=0.025)
    record = make_record(steps, host=host, loaders=[make_loader(0)],
                         activity=[make_activity(pid=JOB_PID, transform=90)])  # fmt: skip
    (f,) = run_input(record)
    assert f.id == "input.workers"
    assert f.evidence["job_cpu_cores"] == pytest.approx(1.8)
    assert f.evidence["job_useful_cpu_cores"] == pytest.approx(1.1)
    assert f.evidence["spare_cores"] == pytest.approx(0.9)  # others (0.05) waited for nothing


def test_others_that_only_use_what_the_job_leaves_take_no_room() -> None:
    # 2 cores, others busy 1.5 cores at a lower priority: the training thread never
    # waits for a CPU, so a worker would get one.
    host = make_host_series(55, usable_cores=2.0, job_cpu_pct=100.0, others_cpu_pct=95.0,
                            **threads(train_cpu_cores=1.0, train_wait_cores=0.01,
                                      train_wait_max_share=0.01))  # fmt: skip
    steps = make_steps(200, 0.25, 0.2, compute=0.05)
    record = make_record(steps, host=host, loaders=[make_loader(0)],
                         activity=[make_activity(pid=JOB_PID, transform=90)])  # fmt: skip
    (f,) = run_input(record)
    assert f.id == "input.workers" and f.evidence["spare_cores"] == pytest.approx(1.0)
    # Waiting a tenth of its time, the same load counts: no core is spare.
    waited = [h.__class__(**{**h.__dict__, "train_wait_cores": 0.1, "train_wait_max_share": 0.1})
              for h in host]  # fmt: skip
    record = make_record(steps, host=waited, loaders=[make_loader(0)],
                         activity=[make_activity(pid=JOB_PID, transform=90)])  # fmt: skip
    assert run_input(record)[0].id == "input.cpu"


# --- a data server of this machine behind the sockets ------------------------------------------


def served_record(workers: int, server: dict[str, int], running: int) -> RunRecord:
    """``http_record``'s sockets answered by a process of this machine looked at ``server``
    times by activity, ``running`` of its threads on a CPU over those looks."""
    record = http_record(workers)
    (a,) = record.loader_activity
    looks = {f"server:{k}": v for k, v in server.items()}
    looks.update({"server_running": running, "peer:4242 python feature_server.py": 100})
    served = dataclasses.replace(a, handoff=looks)
    return dataclasses.replace(record, loader_activity=(served,))


@pytest.mark.parametrize("workers", [0, 2])
def test_sockets_to_a_local_server_that_computes_are_its_cpu(workers: int) -> None:
    f = diagnose_run(served_record(workers, {"cpu": 90, "wait": 10}, 95), strict=True)[0]
    assert (f.id, f.category) == ("input.server_cpu", Category.CPU)
    ev = f.evidence
    assert ev["data_server_pid"] == 4242 and ev["server_cpu_share"] == pytest.approx(0.9)
    assert "feature_server.py" in f.fix and "ThreadPoolExecutor" not in f.fix
    assert "num_workers" not in f.fix  # more workers only queue behind the server
    assert ev["speedup_limited_by"] == "cpu"
    assert ("DataLoader workers" in f.title) == (workers > 0)


@pytest.mark.parametrize("server", [{"wait": 95, "cpu": 5}, {"cpu": 15}])
def test_sockets_to_a_local_server_that_waits_stay_the_network(server: dict[str, int]) -> None:
    f = diagnose_run(served_record(2, server, server.get("cpu", 0)), strict=True)[0]
    assert (f.id, f.category) == ("input.network", Category.NETWORK)
    assert "ThreadPoolExecutor" in f.fix
    # settled (asleep): named in the evidence; too few looks: not
    assert ("server_resource" in f.evidence) == (sum(server.values()) >= TH.activity_min_samples)
