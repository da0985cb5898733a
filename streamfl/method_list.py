"""``streamfl methods``: the named methods, each with when to use it, and what one sets on a fleet.

The list is the registry the simulator and the coordinator share (``streamfl.methods``): the
strategies' own ``fedasync`` and ``fedavg``, then each method package's named runs in calling
order, those of other distributions included. ``--show NAME`` prints what running it on a fleet
means: the coordinator YAML it amounts to (what ``method: NAME`` lays over the file), the agent
side its coordinator sends with every global model, and what each board must set itself
(``streamfl.methods.agent_side``). Top-level imports stay light: every ``streamfl`` call imports
this module.
"""
import argparse
import textwrap

HELP = "list the named methods with when to use each, or show what one sets on a fleet"
DETAILS = ("A named method runs in the simulator (streamfl sim --methods NAME) and on a fleet "
           "(streamfl-coordinator --method NAME, or method: NAME in its YAML). --show NAME prints "
           "the coordinator YAML it amounts to, the settings its coordinator sends the boards with "
           "every global model, and what each board must set in its own YAML. docs/choosing-a-method.md "
           "says which to use from the measured results.")

#: Width the listing wraps its lines to.
WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--show NAME`` and ``--log-level``."""
    parser.add_argument("--show", metavar="NAME",
                        help="print the coordinator YAML and the agent side of method NAME")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default %(default)s")


def run(args: argparse.Namespace) -> int:
    """Print the list, or one method's settings; an unknown name is a ``ConfigError`` (exit 2)."""
    from streamfl import methods
    if args.show:
        print(show(methods.named_method(args.show)), end="")
        return 0
    print(listing(list(methods.named_methods().values())), end="")
    return 0


def listing(named: list) -> str:
    """One entry per method: its name, then when to use it (its description where it says none)."""
    width = max(len(m.name) for m in named) + 2 if named else 0
    out = []
    for method in named:
        text = method.when or method.description
        lines = textwrap.wrap(text, WIDTH - width) or [""]
        out.append(method.name.ljust(width) + lines[0])
        out.extend(" " * width + line for line in lines[1:])
    return "\n".join(out) + "\n"


def figures(method) -> str:
    """Where ``method``'s published figures come from and which of that run's settings the name
    carries to a fleet (``Method.figures``, ``Method.measured``), in one paragraph."""
    from streamfl.methods.base import settings_text
    found = method.figures
    if found is None:
        return "Figures: none published; the settings below are the method's own."
    run = " ".join(["streamfl sim %s" % found.scenario] + ["--set %s" % s for s in found.sets])
    text = "Figures: docs/results.md, '%s' (%s)." % (found.table, run)
    if method.measured:
        text += " The name carries that run's %s to a fleet (in the simulator a scenario sets its own)." % (
            settings_text(method.measured))
    if found.setting_keys:
        text += " Not carried, the run's setting: %s: %s." % (", ".join(found.setting_keys), found.why)
    if found.elsewhere:
        text += " Elsewhere: %s." % found.elsewhere
    return text


def show(method) -> str:
    """What ``method`` sets on a fleet, as three commented YAML documents."""
    import yaml

    from streamfl.methods.agent_side import split
    side = split(method)
    coordinator = dict(method.coordinator)
    coordinator["plugins"] = {name: dict(values) for name, values in method.plugins.items()}

    def comment(text: str) -> str:
        return "".join("# %s\n" % line for line in textwrap.wrap(text, WIDTH - 2, break_on_hyphens=False))

    def dump(values: dict) -> str:
        return yaml.safe_dump(values, sort_keys=False, default_flow_style=False) if values else "{}\n"

    parts = [comment("%s: %s" % (method.name, method.description))]
    if method.when:
        parts.append(comment("When: %s" % method.when))
    parts.append(comment(figures(method)))
    parts.append(comment("Coordinator YAML: what 'method: %s' (or --method %s) lays over the "
                         "coordinator's file; its keys win over the file's." % (method.name, method.name)))
    parts.append(dump(coordinator))
    parts.append("---\n")
    parts.append(comment("Agent side, sent by the coordinator with every global model; each board "
                         "applies what it allows (its plug-ins' settings, the clock policy where "
                         "its own dvfs.policy is not none) and keeps its own YAML for the rest."))
    parts.append(dump(side.sent))
    parts.append("---\n")
    parts.append(comment("Each board's own YAML: settings of the method a coordinator never sends "
                         "(set them in every agent's config)."))
    parts.append(dump(side.board))
    return "".join(parts)
