"""Writes awkward output (partial lines, carriage returns, raw bytes, both streams) and exits.

Arguments: exit code (default 0). Reports whether each stream is a terminal.
"""

import os
import sys
import time


def main():
    code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    out = sys.stdout.buffer
    err = sys.stderr.buffer
    out.write(b"tty: %d %d\n" % (os.isatty(1), os.isatty(2)))
    out.write(b"progress 10%\rprogress 50%\rprogress 100%\n")
    out.flush()
    err.write(b"warning: partial")
    err.flush()
    time.sleep(0.05)
    err.write(b" line\n")
    err.flush()
    out.write(bytes(range(256)))
    out.write(b"\nno newline at the end")
    out.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
