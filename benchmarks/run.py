"""Run ember's benchmark suite (the same as `python -m ember bench`); see ../shared/BENCHMARKS.md for the cases."""

import sys

from ember.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
