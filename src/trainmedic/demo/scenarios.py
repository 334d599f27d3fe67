"""The demo's scenarios: one training set-up per bottleneck, and the finding it should give.

Every scenario runs the same ordinary training script (``train_lenet.py``,
the article's LeNet on synthetic digits) with flags that reproduce one real
cause of slow training on a CPU; the GPU scenarios add a simulation file
whose readings tell the GPU's side of the story while the CPU training runs
for real.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainmedic.findings.model import Category

DEMO_DIR = Path(__file__).resolve().parent
SCRIPT = DEMO_DIR / "train_lenet.py"
DEMO_MODULES = ("torch", "numpy")
"""What the demo's training scripts import beyond trainmedic (the ``demo`` extra)."""
"""The training script the demo runs; it knows nothing about trainmedic."""
SIMULATIONS_DIR = DEMO_DIR / "simulations"

TOLERATED = ("contention.cpu", "contention.steal")
"""Findings the machine itself may add to any scenario: other people's processes
on a shared machine are real, and trainmedic is right to report them."""
BUSY_MACHINE_INPUT_CAUSE = "input.contention"
"""The input rule's cause when other processes starved the loader: on a busy machine it
takes the place of an input scenario's own cause, rightly."""


@dataclass(frozen=True)
class Scenario:
    """One demo set-up.

    Attributes:
        story: what the job does and why it is slow (or not), for the terminal.
        expected: the finding id that should come first; ``None`` for a run
            with no warning or error at all.
        category: the expected finding's category.
        steps: optimizer steps by default (sized for ~15-30 s on 2 cores).
        flags: the training script's flags besides ``--steps`` and ``--dataset-dir``.
        dataset: the demo writes a data set of files (one per sample) for the script.
        checkpoints: the script saves checkpoints (into the demo's scratch directory).
        samples: samples in the data set.
        simulation: simulation file in ``simulations/`` for the GPU readings.
    """

    name: str
    story: str
    expected: str | None
    category: Category
    steps: int
    flags: tuple[str, ...] = ()
    dataset: bool = False
    checkpoints: bool = False
    samples: int = 4096
    simulation: str | None = None

    @property
    def simulation_path(self) -> Path | None:
        return SIMULATIONS_DIR / self.simulation if self.simulation else None

    @property
    def needs_scratch(self) -> bool:
        """Whether the run needs a scratch directory (data set files, checkpoints)."""
        return self.dataset or self.checkpoints

    def script_args(self, steps: int, scratch: Path | None = None) -> list[str]:
        """The training script's arguments for a run of ``steps`` steps; data set
        and checkpoints go under ``scratch`` (:func:`dataset_dir`)."""
        args = ["--steps", str(steps), "--samples", str(self.samples), *self.flags]
        if self.needs_scratch:
            if scratch is None:
                raise ValueError(f"scenario {self.name} needs a scratch directory")
            if self.dataset:
                args += ["--dataset-dir", str(dataset_dir(scratch))]
            if self.checkpoints:
                args += ["--checkpoint-dir", str(scratch / "checkpoints")]
        return args

    @property
    def expectation(self) -> str:
        """The expected outcome in words."""
        if self.expected is None:
            return "no warning or error (run.healthy)"
        return f"{self.expected} ({self.category.value}) first"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="healthy",
            story=(
                "The data set is in memory and the DataLoader hands out ready tensors: "
                "every step is forward, backward and optimizer on the CPU's cores. "
                "Nothing is wrong."
            ),
            expected=None,
            category=Category.CPU,
            steps=600,
        ),
        Scenario(
            name="input-bound",
            story=(
                "Each sample gets a CPU-heavy elastic distortion, and the DataLoader has "
                "num_workers=0: the training process prepares every batch itself, one "
                "sample after the other, while the model waits and the other cores sit "
                "idle."
            ),
            expected="input.workers",
            category=Category.FRAMEWORK_CONFIG,
            steps=250,
            flags=("--augment", "--threads", "1"),
        ),
        Scenario(
            name="slow-storage",
            story=(
                "The data set is one small file per sample on a slow network disk: every "
                "read waits 3 ms for its data. Two DataLoader workers spend their time "
                "blocked in read(), and the model waits for them."
            ),
            expected="input.io",
            category=Category.IO,
            steps=120,
            flags=("--workers", "2", "--threads", "1", "--read-delay-ms", "3"),
            dataset=True,
        ),
        Scenario(
            name="stalls",
            story=(
                "Every 200 steps the script saves model and optimizer with torch.save, "
                "synchronously, to a slow network disk (2 MiB/s): training stops for "
                "about 1.6 s each time."
            ),
            expected="stall.framework_config",
            category=Category.FRAMEWORK_CONFIG,
            steps=700,
            flags=("--checkpoint-every", "200", "--disk-mib-per-s", "2", "--log-every", "100"),
            checkpoints=True,
        ),
        Scenario(
            name="throttling",
            story=(
                "The training runs on this CPU; the GPU's readings come from a simulation "
                "file: a V100 that overheats a few seconds in, its clock cut to half by "
                "thermal slowdown for the rest of the run."
            ),
            expected="thermal.throttle.hw_thermal",
            category=Category.THERMAL,
            steps=600,
            simulation="throttling.json",
        ),
        Scenario(
            name="contention",
            story=(
                "The training runs on this CPU; the GPU's readings come from a simulation "
                "file: another user's job shares the training's GPU for the whole run."
            ),
            expected="contention.gpu_process",
            category=Category.CONTENTION,
            steps=600,
            simulation="contention.json",
        ),
        Scenario(
            name="memory-pressure",
            story=(
                "The training runs on this CPU; the GPU's readings come from a simulation "
                "file: a 16 GiB V100 whose memory in use climbs to 99 % of its capacity."
            ),
            expected="memory.near_capacity",
            category=Category.GPU_MEMORY,
            steps=600,
            simulation="memory-pressure.json",
        ),
    )
}


def dataset_dir(scratch: Path) -> Path:
    """Where a scenario's data set files go inside its scratch directory."""
    return scratch / "digits"


DEFAULT_SCENARIO = "input-bound"
"""The most telling scenario: the commonest real cause, found with no GPU at all."""
