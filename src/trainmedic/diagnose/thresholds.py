"""Every number the run rules judge by, in one place (reasons in docs/diagnosis.md)."""

from __future__ import annotations

from dataclasses import dataclass

from trainmedic.gpu import faults
from trainmedic.host.types import SHM_MIN_BYTES

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Thresholds:
    """Limits of the run rules. Shares are 0..1 of steady step time unless named otherwise.

    Attributes:
        min_steady_steps: fewer steady steps than this and no timing rule judges.
        data_wait_warning_share / data_wait_error_share: data wait (exposed, see
            docs) at which input-bound training is a warning / an error.
        cpu_saturated_share: job CPU at or above this share of the usable cores
            means the job has no spare core.
        cpu_idle_share: job CPU at or below this share of the usable cores means
            cores sit idle.
        activity_dominant_share: a loader state (file read, socket wait,
            transform) is the cause when it holds this share of busy samples.
        activity_min_samples: fewer busy stack samples than this are not judged.
        iowait_high_pct: host iowait (percent of all CPU time) that points at storage.
        net_recv_high_bytes_per_s: receive rate that points at data over the network.
        others_cpu_share: others' CPU at or above this share of the usable cores
            (and at least one core) competes with the job.
        system_cpu_busy_pct: whole-machine CPU at which there is no slack left.
        max_recommended_workers: upper bound of the ``num_workers`` we suggest.
        shm_min_bytes: a ``/dev/shm`` smaller than this is too small for workers.
        gpu_util_low_pct / gpu_util_high_pct: GPU utilization (mean over the
            job's GPUs) under which the GPU is under-used / above which it is the
            bottleneck.
        gpu_loaded_util_pct: a GPU reading counts as "under load" at this utilization
            (doctor's value).
        small_batch_samples: samples per step at or below this are a small batch.
        gpu_memory_low_share: GPU memory used at or below this share is little.
        memory_near_full_share: reserved or used memory at this share of the GPU is full.
        foreign_gpu_min_share: share of run time a foreign process must be on a
            job GPU to be reported.
        throttle_error_share: share of the run's time throttled at which a hard
            throttle becomes an error.
        power_cap_min_share: share of the run's time a power cap must hold clocks
            down to be reported.
        power_cap_clock_ratio: SM clock under this share of its maximum is "well
            below": a power, board or reliability limit then counts (doctor's value).
        temperature_margin_c: loaded temperature this close to slowdown is a warning.
        stall_factor / stall_floor_s: a stall is a step longer than both
            ``stall_factor`` x median and ``stall_floor_s`` seconds.
        stall_warning_share: stalls costing this share of steady time are a warning ...
        stall_single_warning_s: ... when repeated, or one lasted this long, seconds.
        stall_data_share: a stall with at least this share of data wait is a data stall.
        autocast_off_share: share of steps without autocast to call a run full precision.
        mixed_precision_gain: share of GPU-busy time bf16 autocast typically saves.
        amp_skip_warning_share / amp_skip_error_share: share of the optimizer steps
            after GradScaler's warm-up that it skipped, for a warning / an error.
        amp_skip_min: fewer skips after the warm-up are never reported.
        spare_min_cores: cores left over (usable - the job's useful CPU - others')
            from which another loader process has room.
        others_min_cores: others' CPU from which they count as competitors, cores.
        own_full_share: share of the usable cores the job's own runnable threads
            fill, on average, from which they are what keeps the training thread
            waiting for a CPU when others use less than ``others_min_cores``.
        cpu_wait_warning_share / cpu_wait_error_share: share of the training
            thread's time waiting for a CPU that is a warning / an error.
        cpu_wait_info_share: below the warning, a wait from this share is reported
            for information.
        loader_starved_share: loading threads (workers, or the training thread
            with no workers) waiting this share of their time for a CPU are starved.
        steal_high_pct: hypervisor steal (percent of all cores) that takes a
            measurable share of the job's CPU.
        throttled_high_share: share of wall time the job's cgroup was throttled.
        outside_min_samples: stack samples of time outside the step needed to
            say what it was.
        share_z: a share from stack samples is judged by its Wilson interval at this
            many standard deviations (1.645: a 90 % interval, so a bound said to be
            passed is passed with 95 % confidence); see :mod:`trainmedic.diagnose.sampled`.
        worker_handoff_s: what handing one batch from a worker process to the
            training process costs it, at least, seconds: batch building that takes
            less per step is not worth moving into workers.
        tfdata_handover_s: the longest wait per step, seconds, that fetching one batch a
            ``tf.data`` pipeline already holds accounts for: 0.14-0.20 ms measured for a
            cached, prefetched in-memory pipeline of 32-row batches under Keras 3 ``fit``
            on the project's 2-core VM, with headroom for a busier machine.
    """

    min_steady_steps: int = 5
    data_wait_warning_share: float = 0.20
    data_wait_error_share: float = 0.50
    cpu_saturated_share: float = 0.85
    cpu_idle_share: float = 0.50
    activity_dominant_share: float = 0.40
    activity_min_samples: int = 20
    iowait_high_pct: float = 10.0
    net_recv_high_bytes_per_s: float = 10 * MIB
    others_cpu_share: float = 0.25
    system_cpu_busy_pct: float = 85.0
    max_recommended_workers: int = 16
    shm_min_bytes: int = SHM_MIN_BYTES
    gpu_util_low_pct: float = 50.0
    gpu_util_high_pct: float = 80.0
    gpu_loaded_util_pct: float = faults.LOADED_UTILIZATION_PCT
    small_batch_samples: int = 32
    gpu_memory_low_share: float = 0.30
    memory_near_full_share: float = 0.95
    foreign_gpu_min_share: float = 0.05
    throttle_error_share: float = 0.25
    power_cap_min_share: float = 0.10
    power_cap_clock_ratio: float = faults.LIMIT_CLOCK_RATIO
    temperature_margin_c: float = faults.NEAR_SLOWDOWN_MARGIN_C
    stall_factor: float = 5.0
    stall_floor_s: float = 1.0
    stall_warning_share: float = 0.05
    stall_single_warning_s: float = 10.0
    stall_data_share: float = 0.5
    autocast_off_share: float = 0.9
    mixed_precision_gain: float = 0.4
    amp_skip_warning_share: float = 0.02
    amp_skip_error_share: float = 0.5
    amp_skip_min: int = 5
    spare_min_cores: float = 0.5
    others_min_cores: float = 0.5
    own_full_share: float = 0.85
    cpu_wait_warning_share: float = 0.05
    cpu_wait_error_share: float = 0.25
    cpu_wait_info_share: float = 0.02
    loader_starved_share: float = 0.20
    steal_high_pct: float = 5.0
    throttled_high_share: float = 0.05
    outside_min_samples: int = 20
    share_z: float = 1.645
    worker_handoff_s: float = 0.0005
    tfdata_handover_s: float = 0.0005


DEFAULT_THRESHOLDS = Thresholds()
