"""A Python program that computes for a while without torch (a launcher's helper, a
preprocessing step run by the training script's shell wrapper).

    python busy_python.py --seconds 7
"""

import argparse
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=7.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    total = 0
    while time.monotonic() < deadline:
        total += sum(i * i for i in range(1000))
    print(f"done {total % 97}", flush=True)


if __name__ == "__main__":
    main()
