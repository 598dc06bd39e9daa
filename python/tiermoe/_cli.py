"""The `tiermoe` console command: runs the CLI binary shipped inside the package."""
import os
import sys


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tiermoe")
    if not os.access(binary, os.X_OK):
        sys.exit(f"tiermoe: the CLI binary is missing at {binary}; reinstall the package (pip install .)")
    # exec, not a child: signals, exit codes and the terminal are the CLI's own.
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
