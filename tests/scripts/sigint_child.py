"""Waits for Ctrl-C like a training script that checkpoints on interrupt.

Prints "ready" once its handler is installed, then "got SIGINT" when the
signal arrives and exits 0. Gives up after 60 s (exit 2).
"""

import signal
import sys
import time


def on_interrupt(signum, frame):
    print("got SIGINT", flush=True)
    sys.exit(0)


def main():
    signal.signal(signal.SIGINT, on_interrupt)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(2)


if __name__ == "__main__":
    main()
