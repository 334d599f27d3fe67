"""Installs trainmedic's start-up hook next to the package (configuration is in pyproject.toml).

``trainmedic-probe.pth`` goes to the root of site-packages, where Python reads
it at every start of an interpreter of that environment. It does nothing
unless ``trainmedic run`` set its variables in the environment; then it loads
the probe even when a launch script replaced ``PYTHONPATH`` (the way
coverage.py measures subprocesses). A wheel carries it at its root; an
editable install (``pip install -e .``) gets it in its editable wheel too.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = "trainmedic-probe.pth"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", HOOK)


class BuildPyWithStartupHook(build_py):
    """``build_py`` that also puts the start-up hook at the root of what is installed."""

    def run(self) -> None:
        super().run()
        self.copy_file(SOURCE, os.path.join(self._hook_dir(), HOOK), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, HOOK))
        return outputs

    def _hook_dir(self) -> str:
        if getattr(self, "editable_mode", False):
            # An editable wheel holds links to the sources, not build_lib; what it
            # installs as files comes from the directory 'install' writes to.
            target = getattr(self.distribution.get_command_obj("install"), "install_lib", None)
            if target:
                return str(target)
        return str(self.build_lib)


setup(cmdclass={"build_py": BuildPyWithStartupHook})
