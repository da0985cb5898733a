"""``python -m streamfl.coordinator``: the same as the ``streamfl-coordinator`` command."""
import sys

from streamfl.coordinator.cli import main

sys.exit(main())
