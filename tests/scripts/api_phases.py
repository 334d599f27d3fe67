"""A loop that marks its own steps and phases with trainmedic's API (no torch needed).

Arguments: steps, seconds per step.
"""

import sys
import time

import trainmedic


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
    for i in range(steps):
        time.sleep(step_s)
        trainmedic.step()
        if i == steps // 2:
            with trainmedic.phase("eval"):
                time.sleep(3 * step_s)
    print("done", steps)


if __name__ == "__main__":
    main()
