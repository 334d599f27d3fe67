"""``trainmedic run`` on a run directory whose disk fills after BUDGET bytes.

Usage: full_disk_run.py SIZE run ... --out DIR ...

Every write into the run directory goes through the session's write seam;
this driver makes that seam a disk of SIZE bytes holding only the run
directory (``ENOSPC`` past it), so the fault suite covers a full disk
without a filesystem to fill.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading

from trainmedic.cli.main import main
from trainmedic.supervise import session


class FullDisk:
    """``os.write`` on a disk of ``size`` bytes holding only the run directory.

    What is used is what the files under ``run_dir`` occupy (so removing a
    file frees its space, as on a real disk); a write past ``size`` is cut
    short, and the next one fails with ENOSPC.
    """

    def __init__(self, run_dir: str, size: int) -> None:
        self.run_dir = run_dir
        self.size = size
        self.lock = threading.Lock()

    def used(self) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.run_dir):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
        return total

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        with self.lock:
            free = self.size - self.used()
            if free <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return os.write(fd, data[:free])


class FullDiskSession(session.RunSession):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["write"] = DISK
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


DISK = FullDisk(sys.argv[sys.argv.index("--out") + 1], int(sys.argv[1]))
session.RunSession = FullDiskSession  # type: ignore[misc]
sys.exit(main(sys.argv[2:]))
