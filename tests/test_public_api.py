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


def test_every_public_name_resolves() -> None:
    import trainmedic.remedies

    for name in trainmedic.__all__:
        assert getattr(trainmedic, name) is not None, name
    for name in trainmedic.remedies.__all__:
        assert getattr(trainmedic.remedies, name) is not None, name
    assert trainmedic.MicroBatchStep is trainmedic.remedies.MicroBatchStep


def test_importing_the_remedies_does_not_import_torch() -> None:
    # The remedies run inside the job, which has torch; importing them costs nothing
    # until one is used.
    code = (
        "import sys, trainmedic.remedies, trainmedic.remedies.apply_plan; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
