"""The one exception tree of trainmedic.

Every error trainmedic raises on purpose derives from :class:`TrainmedicError`.
The CLI turns each into a one-line message and a non-zero exit code; anything
else that escapes is a bug.

    TrainmedicError                    (exit 1)
    ├── UsageError                     bad flags or arguments (exit 2)
    │   └── InputError                 a file, path or URL given by the user is unusable
    │       ├── SimulationFileError    a simulation file is malformed or incomplete
    │       └── RunDirectoryError      a run directory is missing, unreadable or corrupt
    └── CheckpointError                checkpoints exist but none can be loaded, or one does
                                       not fit

A run directory is something the user named, so its errors are input errors
(exit 2) like any other unusable path. Parts add leaves beside the code that
raises them: ``CommandNotFoundError`` and ``CommandNotExecutableError``
(:mod:`trainmedic.supervise.launch.launcher`), ``FactoryError`` (an ``InputError``),
``MicroBatchError`` and ``TooManyBadSamples`` (:mod:`trainmedic.remedies`),
``InconsistentFinding`` (a rule's finding that contradicts itself in a strict
diagnosis, :mod:`trainmedic.diagnose.consistency`).
"""

from __future__ import annotations


class TrainmedicError(Exception):
    """Base class of all errors trainmedic raises deliberately."""

    exit_code: int = 1


class UsageError(TrainmedicError):
    """The command line asks for something that cannot be done."""

    exit_code = 2


class InputError(UsageError):
    """A path, file or URL named by the user cannot be used.

    The message names the input and what is wrong with it.
    """


class SimulationFileError(InputError):
    """A simulation file is malformed or incomplete.

    Attributes:
        path: the file.
        field: dotted path of the offending field (``gpus[0].memory_total_bytes``),
            or ``None`` when the file as a whole is unreadable.
    """

    def __init__(self, path: str, field: str | None, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        where = f"{path}: {field}" if field else path
        super().__init__(f"simulation file {where}: {problem}")


class RunDirectoryError(InputError):
    """A run directory is missing, unreadable or corrupt."""


class CheckpointError(TrainmedicError):
    """Checkpoints exist but none can be loaded, or the one loaded does not fit.

    Raised instead of silently starting from scratch: a job that has
    checkpoints must not quietly throw its progress away.

    Attributes:
        directory: the checkpoint directory.
        problems: ``(file name, what is wrong)`` for every checkpoint tried,
            newest first.
    """

    def __init__(
        self,
        message: str,
        *,
        directory: str,
        problems: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.directory = directory
        self.problems = problems
        super().__init__(message)
