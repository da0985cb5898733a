"""``python -m streamfl.agent``: the same as the ``streamfl-agent`` command."""
import sys

from streamfl.agent.cli import main

sys.exit(main())
