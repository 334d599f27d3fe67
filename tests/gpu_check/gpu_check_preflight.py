"""The first part of ``scripts/gpu-check``: can this interpreter run the rest?

Prints the interpreter, the packages gpu-check needs and those it can do
without, torch's CUDA build and the GPUs, and starts CUDA (so that its start-up
is paid here, not in the first test). Writes a one-line note for the summary to
the file given as the second argument.

Exit status: 0 when the GPU tests can run (or, with ``--preflight``, when
everything but the GPU is there); 3 when a required package is missing, with
one line saying which; 4 when the packages are there but no GPU is usable.

Usage: ``python gpu_check_preflight.py [--preflight] NOTE_FILE``
"""

from __future__ import annotations

import importlib
import os
import sys

# What gpu-check runs needs, and the distribution to install for each.
REQUIRED = {
    "torch": "torch (a CUDA build)",
    "pynvml": "nvidia-ml-py",
    "psutil": "psutil",
    "click": "click",
    "rich": "rich",
    "pytest": "pytest",
    # `trainmedic run` imports it at start (supervise/session.py -> supervise/live/metrics.py).
    "prometheus_client": "prometheus-client",
}
# What it can do without, and what is lost then.
OPTIONAL = {
    "numpy": "the GPU test of tests/test_checkpoint.py is left out",
    "plotly": "trainmedic run writes no report.html (the GPU run test uses --no-html)",
    "tenacity": "only trainmedic.remedies.ResilientDataset needs it",
    "hypothesis": "nothing gpu-check runs needs it",
    "jinja2": "nothing gpu-check runs needs it",
}
MISSING_PACKAGES, NO_GPU = 3, 4


def main(argv: list[str]) -> int:
    preflight = argv[:1] == ["--preflight"]
    note_file = argv[-1]
    print("python", sys.version.split()[0], sys.executable)
    missing, absent = [], []
    for name, dist in REQUIRED.items():
        try:
            importlib.import_module(name)
        except Exception as exc:
            missing.append(f"{dist} ({type(exc).__name__}: {exc})")
    for name, without in OPTIONAL.items():
        try:
            importlib.import_module(name)
        except Exception:
            absent.append(name)
            print(f"optional {name}: not installed: {without}")
    if os.environ.get("GPU_CHECK_ABSENT"):
        print(f"made absent, as on the GPU machine: {os.environ['GPU_CHECK_ABSENT']}")
    if missing:
        line = "missing required packages: " + "; ".join(missing)
        print(f"gpu-check: {line}")
        _note(note_file, line)
        return MISSING_PACKAGES

    import torch

    import trainmedic

    print("trainmedic from", os.path.dirname(trainmedic.__file__))
    print("torch", torch.__version__, "torch.version.cuda", torch.version.cuda)
    note = f"python {sys.version.split()[0]}, torch {torch.__version__}"
    note += f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (a CPU-only build)"
    if absent:
        note += f"; without {', '.join(absent)}"
    why = None
    if torch.version.cuda is None:
        why = "torch.version.cuda is None: this torch is a CPU-only build"
    elif not torch.cuda.is_available():
        why = "torch.cuda.is_available() is False: the driver or the GPU is not usable"
    else:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpu = f"cuda:{i} {p.name} {p.total_memory / 2**30:.1f} GiB cc {p.major}.{p.minor}"
            print(gpu)
            note += f"; {gpu}"
        torch.zeros(1, device="cuda").sum().item()
    if why is not None:
        print(("preflight: no GPU, as expected here: " if preflight else "gpu-check: ") + why)
        note += f"; no GPU: {why}"
    _note(note_file, note)
    return 0 if why is None or preflight else NO_GPU


def _note(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
