"""A checkpoint directory's files: names, the atomic write, the verified read.

Each checkpoint is a data file (``ckpt-<seq>-step<step>.pt``) and its JSON
manifest (the commit record, written last) holding the data file's size and
SHA-256. Both are written through :mod:`trainmedic.atomicfile`; an
interrupted save leaves only a ``.ckpt-...tmp`` file the next prune removes.
A read checks the manifest against the data file before ``torch.load``
(``weights_only=True``) sees it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainmedic import jsonfile
from trainmedic.atomicfile import atomic_writer

FORMAT = "trainmedic-checkpoint"
FORMAT_VERSION = 1

NAME_RE = re.compile(r"^ckpt-(?P<seq>\d{6,})-step(?P<step>\d+)\.(?P<kind>pt|json)$")
"""A committed checkpoint's files: sequence (save order), step, kind."""
TMP_PREFIX = ".ckpt-"
TMP_SUFFIX = ".tmp"
"""An interrupted save's temporary file: ``.ckpt-...<random>.tmp``."""
HASH_CHUNK_BYTES = 4 * 1024 * 1024
MAX_MANIFEST_BYTES = 1024 * 1024
"""Largest manifest read, bytes (the Checkpointer writes under 1 KiB); larger is corrupt."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint as listed in the directory.

    Attributes:
        sequence: save order, 1 for the first checkpoint ever saved here.
        step: the training step it was saved at.
        manifest: path of the JSON manifest (the commit record).
        data: path of the data file the manifest names.
    """

    sequence: int
    step: int
    manifest: Path
    data: Path


class Unusable(Exception):
    """One checkpoint cannot be used; load falls back to an older one."""


def file_sha256(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of the file at ``path``, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def write_file(
    directory: Path, name: str, write: Callable[[IO[bytes]], Any]
) -> tuple[Path, int, str]:
    """Write ``name`` in ``directory`` atomically (temporary file, fsync, rename,
    fsync of the directory); return (path, size, sha256 hex of the bytes on disk).

    The temporary file is ``.<name>.<random>.tmp``: an interrupted save is
    dropped by the next prune (:data:`TMP_PREFIX`, :data:`TMP_SUFFIX`).
    """
    final = directory / name
    with atomic_writer(final, binary=True) as f:
        write(f)
    # Hashed as read back, so the manifest vouches for what the disk holds.
    size, digest = file_sha256(final)
    return final, size, digest


def read_verified(info: CheckpointInfo, map_location: Any) -> dict[str, Any]:
    """Check the manifest against the data file, then load it with weights_only."""
    import pickle

    import torch

    try:
        manifest = jsonfile.read_json(info.manifest, max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, ValueError) as e:
        raise Unusable(f"manifest unreadable ({jsonfile.describe(e)})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Unusable("manifest is not a trainmedic checkpoint manifest")
    expected_size = manifest.get("size_bytes")
    expected_sha = manifest.get("sha256")
    if manifest.get("data_file") != info.data.name or not isinstance(expected_sha, str):
        raise Unusable("manifest does not name this data file with a sha256")
    try:
        size = info.data.stat().st_size
        if size != expected_size:
            raise Unusable(f"truncated or grown: {size} bytes, manifest says {expected_size}")
        _, digest = file_sha256(info.data)
    except FileNotFoundError as e:
        raise Unusable("data file missing") from e
    except OSError as e:
        raise Unusable(f"data file unreadable ({e.strerror})") from e
    if digest != expected_sha:
        raise Unusable("sha256 mismatch: the data file is corrupt")
    try:
        payload = torch.load(info.data, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Unusable(f"refused by torch.load(weights_only=True): {first_line}") from e
    except Exception as e:  # torch raises RuntimeError, EOFError, zip errors, ...
        raise Unusable(f"torch.load failed: {type(e).__name__}: {e}") from e
    if (
        not isinstance(payload, dict)
        or payload.get("format") != FORMAT
        or payload.get("step") != info.step
    ):
        raise Unusable("data file content does not match its manifest")
    return payload
