"""``pynvml`` for a subprocess under test: the stand-in of ``standin_nvml``.

Put this directory first on ``PYTHONPATH`` and name a state file (JSON, the
format of ``standin_nvml.build``) in ``TRAINMEDIC_STANDIN_NVML``. The real
nvidia-ml-py is loaded under its own name first, for its error classes.
"""

import importlib.machinery
import importlib.util
import json
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("pynvml", _path)
_real = importlib.util.module_from_spec(_spec)
sys.modules["pynvml"] = _real
_spec.loader.exec_module(_real)
sys.path.insert(0, os.path.dirname(_here))
import standin_nvml  # noqa: E402

with open(os.environ["TRAINMEDIC_STANDIN_NVML"], encoding="utf-8") as _f:
    _module = standin_nvml.build(json.load(_f))
sys.modules["pynvml"] = _module
sys.modules[__name__] = _module
