"""The probe: runs inside every Python process of the job, loaded with no code change.

The start-up hook installed with trainmedic (``trainmedic-probe.pth``) or, for
interpreters of other environments, the ``sitecustomize`` of
:mod:`trainmedic.probe.bootstrap` that ``trainmedic run`` puts first on the
job's ``PYTHONPATH`` calls :func:`trainmedic.probe.runtime.activate` (once),
which waits for the job to import torch and then hooks optimizer steps,
module calls, backward calls and DataLoaders. Records go to the supervisor
over :mod:`trainmedic.channel`. docs/run.md describes what is measured and how.
"""

import os

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "bootstrap")
"""The directory the supervisor puts first on the job's ``PYTHONPATH`` (a string:
this module loads at every Python start-up of the job, ``pathlib`` is not free)."""
