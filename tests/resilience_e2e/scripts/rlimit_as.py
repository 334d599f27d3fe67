"""Run a command with its address space limited: ``rlimit_as.py BYTES CMD [ARGS...]``.

The limit (``RLIMIT_AS``) makes large allocations fail at once, the way a
machine out of memory would, without touching the machine's memory.
"""

from __future__ import annotations

import os
import resource
import sys


def main() -> None:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execvp(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    main()
