"""The stand-in seam for the GPUs' compute: what a stress run asks a GPU to do.

:class:`StressMachine` is implemented twice: on real GPUs through torch.cuda
(:mod:`.torch_machine`) and by a simulation description (:mod:`.simulated`), so the
runner and every judgment run on a CPU machine in the tests. Each call is one bounded
*burst* of work; the runner reads the GPUs (clocks, power, reasons) while it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Direction = Literal["h2d", "d2h"]
"""Host to device or device to host."""


@dataclass(frozen=True)
class Work:
    """What one GPU did in one burst.

    Attributes:
        amount: floating-point operations (matmul) or bytes moved (copies; a device
            copy counts each byte read and each byte written).
        seconds: the GPU's own time for it (CUDA events), seconds.
    """

    amount: float
    seconds: float

    @property
    def rate(self) -> float:
        """``amount`` per second (0 for no time)."""
        return self.amount / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class MemtestOutcome:
    """A memory test over part of one GPU's free memory.

    Attributes:
        tested_bytes: bytes of device memory written and read back.
        share_of_free: ``tested_bytes`` over the free memory before the test, 0..1.
        patterns: the patterns written, in order (``0x00000000``, ``address``, ...).
        passes: full rounds of every pattern over the tested memory.
        errors: 32-bit words that read back different from what was written.
        error_offsets: byte offsets of the first wrong words in the tested range (at
            most :data:`MAX_ERROR_OFFSETS`).
        seconds: time the test took, seconds.
    """

    tested_bytes: int
    share_of_free: float
    patterns: tuple[str, ...]
    passes: int
    errors: int
    error_offsets: tuple[int, ...]
    seconds: float


MAX_ERROR_OFFSETS = 256
"""Most wrong words whose offsets a memory test keeps."""

MEMTEST_PATTERNS = ("0x00000000", "0xffffffff", "0x55555555", "0xaaaaaaaa", "address")
"""The memory test's patterns: all bits low, all high, the two checkerboards (each
neighbouring bit differs), and each word's own index (catches address-line faults
that fixed patterns read back fine)."""


class StressMachine(Protocol):
    """The GPUs, as a stress run drives them. Indices are NVML's (the same GPU as the
    :class:`~trainmedic.gpu.backend.GpuBackend` reads)."""

    def dtypes(self, index: int) -> Mapping[str, str | None]:
        """Each matmul dtype of :data:`~.datasheet.DTYPES`: ``None`` when GPU ``index``
        can run it, else why not (``"needs compute capability 8.9"``)."""
        ...

    def matmul(self, indices: Sequence[int], dtype: str, seconds: float) -> dict[int, Work]:
        """Dense matmuls in ``dtype`` on every GPU of ``indices`` at once for about
        ``seconds`` (one index: that GPU alone); FLOP per GPU."""
        ...

    def device_copy(self, indices: Sequence[int], seconds: float) -> dict[int, Work]:
        """Device-to-device copies on every GPU of ``indices`` at once; bytes read plus
        written per GPU."""
        ...

    def memtest(self, index: int, share: float, seconds: float) -> MemtestOutcome:
        """Write and read back :data:`MEMTEST_PATTERNS` over ``share`` of GPU ``index``'s
        free memory, repeating the patterns for about ``seconds``."""
        ...

    def host_copy(self, index: int, direction: Direction, pinned: bool, seconds: float) -> Work:
        """Copies between host memory (pinned or pageable) and GPU ``index``; bytes."""
        ...

    def peer_copy(self, src: int, dst: int, seconds: float) -> Work | None:
        """Copies from GPU ``src`` to GPU ``dst``; bytes. ``None`` when the two have no
        peer access (a copy would be staged through host memory)."""
        ...

    def close(self) -> None:
        """Free what the bursts allocated."""
        ...
