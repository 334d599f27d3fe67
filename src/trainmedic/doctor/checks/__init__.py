"""Doctor's checks: pure functions from :class:`MachineFacts` to findings.

Each module holds the checks of one category; :data:`ALL_CHECKS` lists them
in the order they run. A check never does I/O: everything it judges is in
the facts, so tests build facts by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Finding

Check = Callable[[MachineFacts], Sequence[Finding]]
