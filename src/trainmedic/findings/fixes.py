"""Fix texts that more than one part of trainmedic gives for the same cause.

doctor, the run diagnosis and the failure classifier meet some causes from
different evidence; they must then recommend the same remedy in the same words.
"""

from __future__ import annotations

SHM_FIX = (
    "Give the container a larger /dev/shm: docker run --shm-size=16g (or --ipc=host); "
    "in Kubernetes mount an emptyDir with medium: Memory (and a sizeLimit) at /dev/shm."
)
"""A /dev/shm too small for DataLoader workers (Docker's default is 64 MiB)."""

SHM_FIX_WITH_WORKERS = SHM_FIX + " Or lower DataLoader num_workers / prefetch_factor."
"""The same, for a job whose workers already ran out of shared memory."""
