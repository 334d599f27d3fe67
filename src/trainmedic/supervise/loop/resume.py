"""Where a restarted job resumes: the newest valid checkpoint, and the arguments that say so.

Three kinds of scripts resume across restarts:

* **Checkpointer users** (:class:`trainmedic.Checkpointer` without a
  directory) read ``$TRAINMEDIC_CHECKPOINT_DIR``, which ``trainmedic run``
  sets to ``<run dir>/checkpoints`` unless the job's environment already sets
  it; the Checkpointer itself picks the newest valid checkpoint.
* **Scripts with a resume flag** get ``--resume-args`` on every restart, with
  ``{checkpoint}`` replaced by the newest valid checkpoint and ``{step}`` by its
  step: ``--resume-args "--resume {checkpoint}"``. The checkpoint is the
  newest file matching ``--checkpoint-glob`` (the script's own checkpoints),
  else the newest Checkpointer checkpoint whose manifest, size and SHA-256
  agree. Without any checkpoint yet, nothing is added (a fresh start).
* **Scripts that resume on their own** need nothing.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmedic import jsonfile
from trainmedic.checkpoint import CHECKPOINT_DIR_ENV, MAX_MANIFEST_BYTES, Checkpointer
from trainmedic.errors import CheckpointError, UsageError

CHECKPOINTS_SUBDIR = "checkpoints"
"""``$TRAINMEDIC_CHECKPOINT_DIR`` inside the run directory."""
PLACEHOLDERS = ("checkpoint", "step")
# An escaped brace, a {field}, or a lone brace (an error).
_FIELD_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NUMBER_RE = re.compile(r"(\d+)")


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint the next attempt can resume from.

    Attributes:
        path: the file (a Checkpointer's data file, or a file the glob matched).
        step: its training step: from the manifest, else the last number in
            the file name (``ckpt_step120.pt`` -> 120), else ``None``.
        source: ``checkpointer`` or ``glob``.
        cut: why the glob's search stopped before its end (``None``: it did not),
            so a newer match may exist.
    """

    path: Path
    step: int | None
    source: str
    cut: str | None = None


def parse_resume_template(template: str) -> tuple[str, ...]:
    """The template's arguments, checked: ``{checkpoint}`` and ``{step}`` are the
    only placeholders, ``{{`` and ``}}`` stand for literal braces, and anything
    else with a brace (``{checkpoint``, ``{step!r}``, ``{0}``) is refused.

    Raises:
        UsageError: naming the argument and what is wrong in it.
    """
    try:
        args = tuple(shlex.split(template))
    except ValueError as exc:
        raise UsageError(f"--resume-args {template!r}: {exc}") from None
    if not args:
        raise UsageError("--resume-args is empty")
    known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    for arg in args:
        for m in _FIELD_RE.finditer(arg):
            token, name = m.group(), m.group(1)
            if token in ("{{", "}}") or name in PLACEHOLDERS:
                continue
            where = f"--resume-args: {arg!r}"
            if token == "{":
                raise UsageError(f"{where}: '{{' without its '}}' (write '{{{{' for a brace)")
            if token == "}":
                raise UsageError(f"{where}: '}}' without its '{{' (write '}}}}' for a brace)")
            base = re.split(r"[!:.\[]", name, maxsplit=1)[0]
            if base in PLACEHOLDERS:
                raise UsageError(
                    f"{where}: {token} has a conversion or format; only {known} are replaced"
                )
            raise UsageError(f"{where}: unknown placeholder {token} (known: {known})")
    return args


def resume_arguments(template: tuple[str, ...], point: ResumePoint) -> list[str]:
    """The template with ``{checkpoint}`` and ``{step}`` filled in, ``{{``/``}}`` as braces."""
    values = {
        "checkpoint": str(point.path),
        "step": "" if point.step is None else str(point.step),
    }

    def fill(m: re.Match[str]) -> str:
        token = m.group()
        if token in ("{{", "}}"):
            return token[0]
        return values.get(m.group(1) or "", token)

    return [_FIELD_RE.sub(fill, a) for a in template]


def checkpoint_dir(run_dir: Path, env: dict[str, str]) -> Path:
    """The job's Checkpointer directory: the job's own setting, else the run's."""
    own = env.get(CHECKPOINT_DIR_ENV, "").strip()
    return Path(own) if own else run_dir / CHECKPOINTS_SUBDIR


def newest_checkpoint(
    directory: Path, glob_pattern: str | None = None, cwd: str | None = None
) -> ResumePoint | None:
    """The newest valid checkpoint: from ``glob_pattern`` when given, else the
    Checkpointer's in ``directory``."""
    if glob_pattern:
        return newest_glob_checkpoint(glob_pattern, cwd)
    return newest_checkpointer_checkpoint(directory)


def plan_resume(
    number: int,
    argv: tuple[str, ...],
    resume_args: tuple[str, ...] | None,
    checkpoint_glob: str | None,
    checkpoints: Path,
    cwd: str | None,
) -> tuple[tuple[str, ...], ResumePoint | None, str | None]:
    """Attempt ``number``'s command line, the checkpoint it resumes from and the
    line to tell the person (``None``: nothing to tell).

    The first attempt starts from the beginning; a later one from the newest
    valid checkpoint, whose path and step fill ``resume_args``'s placeholders.
    """
    if number == 1 or not (resume_args or checkpoint_glob):
        return argv, None, None
    resume = newest_checkpoint(checkpoints, checkpoint_glob, cwd)
    if not resume_args:
        return argv, resume, None
    if resume is None:
        return argv, None, f"attempt {number}: no checkpoint yet, starting from the beginning"
    step = "" if resume.step is None else f" (step {resume.step})"
    notice = f"attempt {number} resumes from {resume.path}{step}"
    if resume.cut:
        notice += f" (the newest found; {resume.cut})"
    return (*argv, *resume_arguments(resume_args, resume)), resume, notice


def newest_checkpointer_checkpoint(directory: Path) -> ResumePoint | None:
    """The newest committed Checkpointer checkpoint whose data file matches its
    manifest (size and SHA-256); older ones are tried when the newest does not."""
    try:
        candidates = Checkpointer(directory).checkpoints()
    except CheckpointError:
        return None
    for info in candidates:
        try:
            manifest = jsonfile.read_json(info.manifest, max_bytes=MAX_MANIFEST_BYTES)
            size = int(manifest["size_bytes"])
            digest = str(manifest["sha256"])
            if not isinstance(manifest, dict):
                continue
            if info.data.stat().st_size != size or _sha256(info.data) != digest:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return ResumePoint(info.data, info.step, "checkpointer")
    return None


GLOB_MAX_MATCHES = 100_000
"""Matches of ``--checkpoint-glob`` looked at, at most, before a restart."""
GLOB_MAX_S = 10.0
"""Seconds the search for the newest match may take before a restart."""


def newest_glob_checkpoint(
    pattern: str,
    cwd: str | None = None,
    *,
    max_matches: int = GLOB_MAX_MATCHES,
    max_s: float = GLOB_MAX_S,
    clock: Callable[[], float] = time.monotonic,
) -> ResumePoint | None:
    """The most recently modified non-empty file matching ``pattern`` (relative
    to ``cwd``, the job's working directory).

    The search is bounded: a pattern such as ``/**`` would walk the whole
    filesystem while the job waits to restart. Past ``max_matches`` matches or
    ``max_s`` seconds it stops, and the newest file seen so far is returned
    with ``cut`` saying so.
    """
    base = Path(cwd or os.getcwd())
    full = pattern if os.path.isabs(pattern) else str(base / pattern)
    newest: tuple[float, Path] | None = None
    deadline = clock() + max_s
    cut: str | None = None
    for seen, name in enumerate(glob.iglob(full, recursive=True)):
        if seen >= max_matches:
            cut = f"--checkpoint-glob matched over {max_matches:,} paths: narrow it"
            break
        if clock() > deadline:
            cut = f"--checkpoint-glob was searched for {max_s:g} s: narrow it"
            break
        path = Path(name)
        try:
            st = path.stat()
        except OSError:
            continue
        if not path.is_file() or st.st_size == 0:
            continue
        if newest is None or st.st_mtime > newest[0]:
            newest = (st.st_mtime, path)
    if newest is None:
        return None
    numbers = _NUMBER_RE.findall(newest[1].name)
    return ResumePoint(newest[1], int(numbers[-1]) if numbers else None, "glob", cut)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(4 * 1024 * 1024), b""):
            h.update(chunk)
    return h.hexdigest()
