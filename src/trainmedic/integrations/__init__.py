"""Callbacks that tell trainmedic a framework's step boundaries and phases.

* :mod:`trainmedic.integrations.lightning` — ``TrainmedicCallback`` for PyTorch
  Lightning (``lightning.pytorch`` or ``pytorch_lightning``);
* :mod:`trainmedic.integrations.huggingface` — ``TrainmedicCallback`` for the
  Hugging Face ``Trainer``.

Each marks one step per optimizer step (``trainmedic.step()``), evaluation as
phase ``eval`` and checkpoint saving as phase ``checkpoint``
(``trainmedic.phase()``), so the watchdog gives them their own bounds and
the report keeps them out of step times. Outside ``trainmedic run`` they
cost a dictionary lookup per call. The frameworks are optional
(``pip install trainmedic[lightning]`` / ``trainmedic[hf]``): importing
this package imports neither; importing a submodule imports its framework.
"""
