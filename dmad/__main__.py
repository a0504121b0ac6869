"""python -m dmad: the same command line as the `dmad` console script."""
import sys

from dmad.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
