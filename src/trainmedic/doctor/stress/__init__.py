"""``trainmedic doctor --stress``: is each GPU as fast and as sound as it should be?

A bounded burn-in (docs/stress.md): :mod:`.runner` drives a :class:`~.machine.StressMachine`
(torch.cuda in :mod:`.torch_machine`, a simulation in :mod:`.simulated`) and reads the GPU
backend during the bursts (:mod:`.sampling`, summed up by :mod:`.readings`) into a
:class:`~.results.StressResult`; :mod:`.judge`, :mod:`.judge_together` and
:mod:`.judge_health` turn it into findings against :mod:`.datasheet`'s table and the
machine's other GPUs; :mod:`.dcgm` runs and reads ``dcgmi diag``.
"""

from trainmedic.doctor.stress.judge import judge_stress
from trainmedic.doctor.stress.results import StressResult
from trainmedic.doctor.stress.runner import (
    GpuBusyError,
    NoGpuToStress,
    StressPlan,
    parse_gpu_list,
    run_stress,
)

__all__ = [
    "GpuBusyError",
    "NoGpuToStress",
    "StressPlan",
    "StressResult",
    "judge_stress",
    "parse_gpu_list",
    "run_stress",
]
