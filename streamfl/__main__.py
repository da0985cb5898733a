"""``python -m streamfl``: the ``streamfl`` command, where its script is not on the PATH."""
import sys

from streamfl.cli import main

if __name__ == "__main__":  # spawned worker processes import this module again: run nothing then
    sys.exit(main())
