"""Ctrl-C while the command line loads: one line and 130, never a traceback."""

from __future__ import annotations

import subprocess
import sys

# A finder that raises KeyboardInterrupt when the command line is imported: the Ctrl-C
# arrives in that window, every time.
INTERRUPT_ON_IMPORT = """
import sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "trainmedic.cli.main":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
from trainmedic._entry import main
sys.exit(main())
"""


def test_ctrl_c_while_the_command_line_loads_is_one_line() -> None:
    got = subprocess.run([sys.executable, "-c", INTERRUPT_ON_IMPORT, "--version"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert got.returncode == 130
    assert got.stderr == "trainmedic: interrupted\n"


def test_the_console_script_and_python_m_both_start_there() -> None:
    got = subprocess.run([sys.executable, "-m", "trainmedic", "--version"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert got.returncode == 0 and got.stdout.strip()
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "trainmedic"]
    assert script.value == "trainmedic._entry:main"
