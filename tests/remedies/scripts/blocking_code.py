"""User code that never returns, for ``trainmedic tune``'s budget: a factory that blocks,
and a dataset whose ``__getitem__`` blocks. Each writes its pid first, to the file named in
``BLOCKING_PID_FILE``, so a test can see the process is gone afterwards."""

import os
import threading


def _note_pid() -> None:
    path = os.environ.get("BLOCKING_PID_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


def factory():
    _note_pid()
    threading.Event().wait()  # a lock never released


class Stuck:
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        _note_pid()
        threading.Event().wait()


def stuck_dataset():
    return Stuck()


def exits():
    os._exit(0)  # ends the process where it stands, as some libraries do
