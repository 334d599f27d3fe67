"""The public surface of the package is deliberate: pin it."""

from __future__ import annotations

import subprocess
import sys

import trainmedic


def test_version_is_exported() -> None:
    assert trainmedic.__version__.count(".") == 2


def test_import_does_not_import_torch() -> None:
    # `import trainmedic` runs inside every training process (the probe) and in
    # every CLI call: it must stay cheap, so it must never pull in torch.
    code = "import sys, trainmedic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
