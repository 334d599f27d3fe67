"""What a TensorFlow job runs with on its GPUs, read from TensorFlow itself.

Three settings decide much of a TensorFlow job's speed and memory on a GPU, and none
shows from outside the process:

* **memory growth**: by default TensorFlow takes nearly all of each visible GPU's
  memory at start, for its own pool. nvidia-smi (and NVML) then show the GPU full
  whatever the job needs, and any other process on that GPU runs out of memory. The
  pool's own counters (``tf.config.experimental.get_memory_info``: bytes in use now
  and at peak) say what the job really uses;
* **the dtype policy** (``mixed_float16``/``mixed_bfloat16`` or ``float32``): mixed
  precision runs matrix products on the tensor cores;
* **XLA**: ``jit_compile`` of the model fit trains, and TensorFlow's global
  auto-clustering (``tf.config.optimizer.get_jit``).

:func:`read` reads them (a few C calls, no GPU work); the probe sends them as a
``tf_gpu`` event at a few step counts (:data:`AT_STEPS`), only where TensorFlow sees a
GPU. The diagnosis takes the job's real memory from them and names the settings.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

AT_STEPS = (20, 200, 2000, 20000)
"""Training steps after which the facts are read and sent: after the warm-up, then
seldom, so that the pool's peak is the job's and not its first step's."""

GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
"""The environment variable that turns memory growth on with no code change."""


def dtype_policy(modules: dict[str, Any]) -> str | None:
    """The global dtype policy's name (``mixed_bfloat16``, ``float32``), from Keras 3
    (``keras.config.dtype_policy``) or Keras 2 (``mixed_precision.global_policy``)."""
    keras = modules.get("keras")
    with contextlib.suppress(Exception):
        if keras is not None and hasattr(keras, "config"):
            return str(keras.config.dtype_policy().name)
    tf_keras = modules.get("tf_keras")
    with contextlib.suppress(Exception):
        if tf_keras is not None:
            return str(tf_keras.mixed_precision.global_policy().name)
    return None


def read(tf: Any, modules: dict[str, Any], jit_compile: bool | None) -> dict[str, Any] | None:
    """The job's GPU settings and its pool's bytes, or ``None`` when TensorFlow sees no
    GPU. ``modules``: the job's imported modules (``sys.modules``); ``jit_compile``:
    the model fit trains compiles with XLA (``None``: no fit, or not said).

    Returns ``{"gpus": [{"index", "name", "memory_growth", "in_use_bytes",
    "peak_bytes"}], "growth_env", "dtype_policy", "jit_compile", "auto_jit"}``; each
    GPU's ``index`` is TensorFlow's (``GPU:index``, among the visible devices).
    """
    try:
        devices = list(tf.config.list_physical_devices("GPU"))
    except Exception:
        return None
    if not devices:
        return None
    gpus: list[dict[str, Any]] = []
    for index, device in enumerate(devices):
        entry: dict[str, Any] = {"index": index, "name": str(getattr(device, "name", ""))}
        with contextlib.suppress(Exception):
            entry["memory_growth"] = bool(tf.config.experimental.get_memory_growth(device))
        with contextlib.suppress(Exception):
            info = tf.config.experimental.get_memory_info(f"GPU:{index}")
            entry["in_use_bytes"] = int(info["current"])
            entry["peak_bytes"] = int(info["peak"])
        gpus.append(entry)
    auto_jit: str | None = None
    with contextlib.suppress(Exception):
        auto_jit = str(tf.config.optimizer.get_jit() or "") or None
    return {
        "gpus": gpus,
        "growth_env": os.environ.get(GROWTH_ENV, "").strip().lower() == "true",
        "dtype_policy": dtype_policy(modules),
        "jit_compile": jit_compile,
        "auto_jit": auto_jit,
    }
