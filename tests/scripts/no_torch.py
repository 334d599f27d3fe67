"""A Python program that never touches torch. Argument: iterations."""

import sys


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    total = sum(i * i for i in range(n))
    print("total", total)
    print("torch loaded:", "torch" in sys.modules)


if __name__ == "__main__":
    main()
