"""Other processes on the job's GPU or CPU, from simulated GPU and host series."""

from __future__ import annotations

from dataclasses import replace

import pytest

from support.builders import (
    GIB,
    T0,
    during,
    make_activity,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_machine,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.contention import cpu_contention, gpu_contention
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Severity
from trainmedic.gpu.types import GpuProcess
from trainmedic.record.types import RunRecord

TH = Thresholds()
BOB = GpuProcess(pid=999, used_memory_bytes=10 * GIB, user="bob", name="python")


def shared_gpu_record(t_from: float, t_to: float, *, slow: float = 0.2) -> RunRecord:
    """100 steps of 0.1 s; steps ending in [t_from, t_to] take ``slow`` s and bob's
    process sits on GPU 0 meanwhile."""
    durations = []
    t = T0
    for _ in range(100):
        d = slow if t_from <= t + 0.1 <= t_to else 0.1
        durations.append(d)
        t += d
    series = make_gpu_series(int(t) - int(T0) + 2, period=1.0)
    series = during(series, t_from, t_to + 1.0, processes=(*series[0].processes, BOB))
    return make_record(make_steps(100, durations=durations), gpu=series)


def test_foreign_process_part_of_the_run_with_measured_slowdown() -> None:
    (f,) = gpu_contention(RunView.of(shared_gpu_record(T0 + 3.0, T0 + 5.0)), TH)
    assert f.id == "contention.gpu_process" and f.category is Category.CONTENTION
    assert f.severity is Severity.WARNING and f.subject == "gpu0"
    assert f.evidence["foreign_processes"][0]["pid"] == 999
    assert f.evidence["foreign_processes"][0]["used_memory_mib"] == pytest.approx(10240.0)
    assert 0.1 < f.evidence["foreign_time_share"] < 0.5
    assert f.impact is not None and 0.05 < f.impact < 0.5
    assert "CUDA_VISIBLE_DEVICES" in f.fix


def test_foreign_process_without_effect_is_information() -> None:
    (f,) = gpu_contention(RunView.of(shared_gpu_record(T0 + 3.0, T0 + 5.0, slow=0.1)), TH)
    assert f.severity is Severity.INFO and f.impact == pytest.approx(0.0)


def test_foreign_process_all_run_long_is_a_warning_without_impact() -> None:
    record = make_record(make_steps(100), gpu=make_gpu_series(12, others=(BOB,)))
    (f,) = gpu_contention(RunView.of(record), TH)
    assert f.severity is Severity.WARNING and f.impact is None
    assert f.evidence["foreign_time_share"] == pytest.approx(1.0)


def test_one_sample_blip_under_the_time_share_is_quiet() -> None:
    series = make_gpu_series(100, period=0.1)
    series = during(series, T0 + 5.0, T0 + 5.05, processes=(*series[0].processes, BOB))
    record = make_record(make_steps(100), gpu=series)
    assert gpu_contention(RunView.of(record), TH) == []


def test_no_job_pid_visible_uses_users() -> None:
    # pids from another namespace: our own process shows as pid 1 of user alice
    me = GpuProcess(pid=1, user="alice", name="python")
    record = make_record(make_steps(100), gpu=make_gpu_series(12, job_pids=(), others=(me,)))
    assert gpu_contention(RunView.of(record, make_machine(user="alice")), TH) == []
    record = make_record(make_steps(100), gpu=make_gpu_series(12, job_pids=(), others=(me, BOB)))
    (f,) = gpu_contention(RunView.of(record, make_machine(user="alice")), TH)
    assert [p["pid"] for p in f.evidence["foreign_processes"]] == [999]
    assert f.evidence["pid_namespace_matches"] is False


def test_job_user_from_the_recorded_environment() -> None:
    me = GpuProcess(pid=1, user="alice", name="python")
    record = make_record(make_steps(100), gpu=make_gpu_series(12, job_pids=(), others=(me, BOB)))
    record.meta = replace(record.meta, environment={"host": {"user": "alice"}})
    assert len(gpu_contention(RunView.of(record), TH)) == 1


def test_gpu_the_job_does_not_use_is_not_judged() -> None:
    record = make_record(
        make_steps(100),
        gpu=make_gpu_series(12) + make_gpu_series(12, index=1, job_pids=(), others=(BOB,)),
    )
    assert gpu_contention(RunView.of(record), TH) == []


# --- CPU -------------------------------------------------------------------------------


def busy_host_record(others_pct: float, system_pct: float = 95.0) -> RunRecord:
    return make_record(
        make_steps(100, 0.1),
        host=make_host_series(12, others_cpu_pct=others_pct, system_cpu_pct=system_pct),
    )


def test_others_using_a_quarter_of_the_cores_on_a_full_machine() -> None:
    (f,) = cpu_contention(RunView.of(busy_host_record(800.0)), TH)
    assert f.id == "contention.cpu" and f.subject == "host"
    assert f.evidence["others_cpu_cores"] == pytest.approx(8.0)
    assert f.evidence["others_cpu_limit_cores"] == pytest.approx(4.0)
    assert f.severity is Severity.WARNING


@pytest.mark.parametrize(
    ("others", "system", "fires"),
    [(400.0, 85.0, True), (399.0, 95.0, False), (800.0, 84.0, False)],
)
def test_cpu_edges(others: float, system: float, fires: bool) -> None:
    assert bool(cpu_contention(RunView.of(busy_host_record(others, system)), TH)) is fires


def test_input_bound_run_leaves_cpu_contention_to_the_input_rule() -> None:
    record = make_record(
        make_steps(100, 0.1, 0.05),
        host=make_host_series(12, others_cpu_pct=800.0, system_cpu_pct=95.0),
        loaders=[make_loader(8)],
    )
    assert cpu_contention(RunView.of(record), TH) == []


# --- measured: the training thread's run-queue delay ---------------------------------------


def measured(wait: float, *, others: float = 150.0, runnable_extra: float = 0.0,
             **host: float) -> RunRecord:  # fmt: skip
    """A compute-bound job on 2 cores whose training thread waited ``wait`` of its time."""
    fields = {
        "usable_cores": 2.0, "job_cpu_pct": 100.0 * (1.0 - wait) + 50.0,
        "others_cpu_pct": others, "system_cpu_pct": 95.0, "train_threads": 1,
        "train_cpu_cores": 1.0 - wait, "train_wait_cores": wait, "train_wait_max_share": wait,
        "helper_cpu_cores": 0.5, "job_threads": 6, "job_wait_cores": wait + runnable_extra,
    }  # fmt: skip
    fields.update(host)
    return make_record(make_steps(100, 0.1), host=make_host_series(12, **fields))


@pytest.mark.parametrize(
    ("wait", "severity"),
    [(0.01, None), (0.03, Severity.INFO), (0.08, Severity.WARNING), (0.6, Severity.ERROR)],
)
def test_severity_and_impact_follow_the_training_threads_wait(
    wait: float, severity: Severity | None
) -> None:
    found = cpu_contention(RunView.of(measured(wait)), TH)
    if severity is None:
        assert found == []
        return
    (f,) = found
    assert f.id == "contention.cpu" and f.severity is severity
    assert f.impact == pytest.approx(wait)
    assert f.evidence["train_cpu_wait_share"] == pytest.approx(wait)


def test_moderate_load_from_others_is_reported_when_it_costs() -> None:
    # Others use 0.6 of 2 cores (the old rule wanted a whole core and a full machine).
    (f,) = cpu_contention(RunView.of(measured(0.12, others=60.0, system_cpu_pct=60.0)), TH)
    assert f.id == "contention.cpu" and f.severity is Severity.WARNING


def test_a_small_wait_with_no_one_to_blame_names_no_other_processes() -> None:
    # A job of two busy threads on 2 cores, others at 0.02 cores: a 2.5 % wait is the
    # machine's ordinary scheduling, not "other processes" (seen on a healthy run).
    assert cpu_contention(RunView.of(measured(0.025, others=2.0)), TH) == []
    # Nor is a 5-6 % wait, which others' 0.02 cores cannot account for: a healthy job of
    # torch's two threads on 2 cores waited that long (called "other processes" in CI).
    assert cpu_contention(RunView.of(measured(0.06, others=2.0)), TH) == []
    assert cpu_contention(RunView.of(measured(0.095, others=2.0)), TH) == []
    # A wait that costs more is still reported, and by elimination it is the job's own.
    (f,) = cpu_contention(RunView.of(measured(0.12, others=2.0)), TH)
    assert f.id == "cpu.oversubscribed" and f.severity is Severity.WARNING
    assert "in bursts" in f.title and "others 0.02" in f.title, f.title
    assert "Other processes" not in f.title and "torch.set_num_threads(1)" in f.fix
    # Others whose CPU covers the wait are still named, however little they use.
    (g,) = cpu_contention(RunView.of(measured(0.06, others=10.0)), TH)
    assert g.id == "contention.cpu" and "Other processes take CPU time" in g.title


def test_a_wait_behind_the_jobs_own_threads_filling_the_cores_is_not_others() -> None:
    # 1.9 of 2 cores runnable in the job, others at 0.01 cores: an event loop computing
    # batches beside the training process's own compute threads (seen in a CI run, where
    # it was called "other processes take CPU time").
    full = measured(0.08, others=1.0, job_cpu_pct=175.0, job_wait_cores=0.15)
    (f,) = cpu_contention(RunView.of(full), TH)
    assert f.id == "cpu.oversubscribed" and f.category is Category.CPU
    assert f.severity is Severity.WARNING and f.impact == pytest.approx(0.08)
    assert "keep its 2 cores full (1.9 busy" in f.title
    assert "torch.set_num_threads(1)" in f.fix and "Other processes" not in f.title
    # Below the job's full share (1.6 of 2), others at 0.01 cores cannot account for an
    # 8 % wait: the ordinary scheduling of a nearly full machine, not a finding.
    assert cpu_contention(RunView.of(measured(0.08, others=1.0, job_cpu_pct=150.0,
                                              job_wait_cores=0.1)), TH) == []  # fmt: skip


def test_the_wait_trainmedics_own_cpu_explains_is_not_the_jobs() -> None:
    # Two busy threads on 2 cores beside 0.08 cores of supervisor and py-spy: a 6 % wait
    # (seen in CI on a healthy job, called "the job's own threads keep its 2 cores full").
    # The tool displaces 0.08 / 2 = 4 % of the training thread's time: 2 % is left, the
    # ordinary scheduling of a full machine.
    def full(wait: float, tool: float | None) -> RunRecord:
        extra = {} if tool is None else {"tool_cpu_pct": tool}
        return measured(wait, others=1.0, job_cpu_pct=190.0, job_wait_cores=0.1, **extra)

    assert cpu_contention(RunView.of(full(0.06, 8.0)), TH) == []
    # The same wait without the tool's CPU to explain it is the job's own threads'.
    (f,) = cpu_contention(RunView.of(full(0.06, None)), TH)
    assert f.id == "cpu.oversubscribed" and f.impact == pytest.approx(0.06)
    # A wait beyond it is still named, less the tool's part, which the title states.
    (g,) = cpu_contention(RunView.of(full(0.2, 8.0)), TH)
    assert g.id == "cpu.oversubscribed" and g.impact == pytest.approx(0.2 - 0.08 / 2.0)
    assert g.evidence["train_cpu_wait_share"] == pytest.approx(0.2)
    assert g.evidence["tool_cpu_wait_share"] == pytest.approx(0.04)
    assert "20% of its time (4% of it for trainmedic's own CPU)" in g.title, g.title
    # On cores the job leaves free, the tool's CPU displaces no one.
    spare = measured(0.06, others=10.0, job_cpu_pct=100.0, job_wait_cores=0.06,
                     tool_cpu_pct=8.0)  # fmt: skip
    (h,) = cpu_contention(RunView.of(spare), TH)
    assert h.impact == pytest.approx(0.06) and "tool_cpu_wait_share" not in h.evidence


def test_others_present_but_costing_nothing_is_quiet() -> None:
    assert cpu_contention(RunView.of(measured(0.0, others=180.0)), TH) == []


def test_the_wait_is_attributed_to_its_cause() -> None:
    steal = measured(0.2, others=10.0, steal_pct=12.0)
    assert cpu_contention(RunView.of(steal), TH)[0].id == "contention.steal"
    own = measured(0.2, others=10.0, runnable_extra=1.5)  # 3+ busy threads on 2 cores
    (f,) = cpu_contention(RunView.of(own), TH)
    assert f.id == "cpu.oversubscribed" and f.category is Category.CPU
    assert "torch.set_num_threads(2)" in f.fix
    host = measured(0.2).host
    host = [
        h.__class__(**{**h.__dict__, "cgroup_throttled_s": 0.2 * i}) for i, h in enumerate(host)
    ]
    quota = make_record(make_steps(100, 0.1), host=host)
    (f,) = cpu_contention(RunView.of(quota), TH)
    assert f.id == "cpu.throttled" and f.evidence["cgroup_throttled_share"] == pytest.approx(0.2)


# --- a GPU shared for the whole run -----------------------------------------------------


def test_a_foreign_process_on_an_idle_gpu_all_run_is_information() -> None:
    record = make_record(
        make_steps(100), gpu=make_gpu_series(12, others=(BOB,), utilization_gpu_pct=20.0)
    )
    (f,) = gpu_contention(RunView.of(record), TH)
    assert f.severity is Severity.INFO and f.impact is None


def test_a_job_that_would_wait_on_an_idle_machine_is_oversubscribed_even_among_others() -> None:
    # 3.4 runnable threads on 2 cores (8 intra-op threads), others busy 1.3 cores: the
    # job's own excess (1.4 cores) alone makes its thread wait.
    record = measured(0.4, others=130.0, runnable_extra=1.9)
    (f,) = cpu_contention(RunView.of(record), TH)
    assert f.id == "cpu.oversubscribed"
    assert f.evidence["job_runnable_cores"] > 3.0


# --- the job's own loading fills the cores ------------------------------------------------


def loading_saturated(*, others: float = 14.0, helper_cpu: float = 0.3) -> RunRecord:
    """Two DataLoader workers filter samples on 2 cores: the loop waits for data 40 % of
    each step, and its training thread waits for a CPU 27 % of its time behind them
    (2.8 threads runnable): the corpus's cpu-saturated-workers run on a CI machine."""
    fields = {
        "usable_cores": 2.0, "job_cpu_pct": 175.0 if others < 50 else 130.0,
        "others_cpu_pct": others, "system_cpu_pct": 97.0, "train_threads": 1,
        "train_cpu_cores": 0.15, "train_wait_cores": 0.27, "train_wait_max_share": 0.27,
        "helper_cpu_cores": helper_cpu, "loader_cpu_cores": 1.3, "loader_wait_cores": 0.58,
        "job_threads": 9, "job_wait_cores": 1.05,
    }  # fmt: skip
    return make_record(
        make_steps(200, 0.1, 0.04),
        host=make_host_series(25, **fields),
        loaders=[make_loader(2)],
        activity=[make_activity(transform=95, idle=20)],
    )


def test_a_training_thread_waiting_behind_its_own_saturated_loader_is_the_input_rules() -> None:
    # The excess threads are the workers: set_num_threads would shed nothing, and no
    # other process took the CPU. The input rule names the cores (input.cpu), first.
    record = loading_saturated()
    assert cpu_contention(RunView.of(record), TH) == []
    findings = diagnose_run(record)
    assert findings[0].id == "input.cpu"
    assert findings[0].evidence["train_cpu_wait_share"] == pytest.approx(0.27)
    assert not any(f.id in ("cpu.oversubscribed", "contention.cpu") for f in findings)


def test_others_or_busy_intra_op_threads_beside_a_saturated_loader_are_still_named() -> None:
    # A case that should fool the rule above: the same saturated loader, with another
    # user's process on a core, or with the training process's intra-op pool working.
    crowded = diagnose_run(loading_saturated(others=100.0))[0]
    assert crowded.category is Category.CONTENTION
    assert crowded.evidence["others_cpu_cores"] == pytest.approx(1.0)
    busy = loading_saturated(helper_cpu=0.9)
    busy.steps = make_steps(200, 0.1, 0.04, compute=0.06)
    (own,) = cpu_contention(RunView.of(busy), TH)
    assert own.id == "cpu.oversubscribed"
