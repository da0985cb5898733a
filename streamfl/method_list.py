"""Placeholder while the ``method_list`` sub-command is written (replaced in this change)."""
HELP = "(being written)"
DETAILS = ""


def add_arguments(parser) -> None:
    """No arguments yet."""


def run(args) -> int:
    raise SystemExit("not written yet")
