"""The ``streamfl`` command: tools around the fleet: ``demo``, ``sim``, ``tune``, ``report``,
``operator``, and the sub-commands of ``TOOLS`` (``status``, ``methods``, ``dataset``)."""
import argparse
import importlib
import sys
from typing import List, Optional

from streamfl import __version__
from streamfl.errors import ConfigError, StreamflError
from streamfl.logs import setup_logging
from streamfl.methods import report_renderer, report_sections


#: The help texts: plain words, since argparse prints them as they are (a docstring's ``markup``
#: would show).
DESCRIPTION = ("Tools around a streamfl fleet: see and command a running fleet, choose a method, "
               "make datasets from your recordings, run a local demo fleet, simulate methods on a "
               "virtual fleet, and report on a simulated or real run. The boards run "
               "streamfl-agent, the server streamfl-coordinator.")
DEMO_HELP = "run a broker, a coordinator and N agents on this machine"
SIM_HELP = "run a scenario's methods on a simulated fleet in virtual time"
REPORT_HELP = "PNG plots and an HTML page from a sim run folder or a real fleet's run folder"
TUNE_HELP = "find each method's best learning rate on a scenario with a small sweep"
OPERATOR_HELP = ("send the running coordinator an operator's command (status; pause, resume, logs or "
                 "set for the boards; or a kind one of its plug-ins knows) and print its answer")


#: Sub-commands that live in a module of their own: ``{name: module}``. Each module has ``HELP``
#: (one line), ``DETAILS`` (the rest of its --help), ``add_arguments(parser)`` and ``run(args) ->
#: exit code``; its top-level imports stay light, since every ``streamfl`` call imports it.
TOOLS = {
    "status": "streamfl.status",
    "methods": "streamfl.method_list",
    "dataset": "streamfl.recordings",
    "export": "streamfl.export",
    "provision": "streamfl.provision.cli",
}


def _sub(sub, name: str, help_text: str, details: str) -> argparse.ArgumentParser:
    """A sub-command whose own --help starts with its one-line help and ``details``."""
    return sub.add_parser(name, help=help_text,
                          description="%s%s. %s" % (help_text[0].upper(), help_text[1:], details))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamfl", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version="streamfl " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    demo = _sub(sub, "demo", DEMO_HELP,
                "Separate processes over a real MQTT broker, running the very programs of a "
                "deployment (streamfl-coordinator, streamfl-agent) on synthetic sensor streams.")
    demo.add_argument("--agents", type=int, default=3, help="number of agent processes (default 3)")
    demo.add_argument("--duration", type=float, default=120.0,
                      help="seconds of federated training after start-up (default 120)")
    demo.add_argument("--run-dir", default=None, help="output folder (default runs/demo-<time>)")
    demo.add_argument("--model", default="lstm", help="model architecture (lstm, cnn1d, mlp)")
    demo.add_argument("--strategy", default="fedasync", choices=("fedasync", "fedavg"))
    demo.add_argument("--broker", default="auto", choices=("auto", "mosquitto", "amqtt"),
                      help="broker to start: mosquitto when on PATH, else embedded amqtt")
    demo.add_argument("--dvfs-policy", default="clp-aware",
                      choices=("none", "performance", "powersave", "clp-aware"),
                      help="clock policy of the simulated boards (default clp-aware)")
    demo.add_argument("--log-level", default="INFO")
    sim = _sub(sub, "sim", SIM_HELP,
               "Every method runs the real coordinator and agent cores on the same streams and "
               "devices; the output folder gets metrics and a summary.")
    sim.add_argument("scenario", help="scenario YAML (see configs/scenarios/)")
    sim.add_argument("--methods", help="comma-separated methods (default: the scenario's)")
    sim.add_argument("--seeds", type=int, help="number of seeds (default: the scenario's)")
    sim.add_argument("--dataset",
                     help="run on your own .npz (X float32 [N,T,C], y int64 [N], subject int64 [N], "
                          "classes str [K]) instead, all of it (the scenario's n_windows is dropped); "
                          "the scenario's partition is kept (subjects count only for partition: "
                          "subject)")
    sim.add_argument("--duration", type=float, help="virtual seconds (default: the scenario's)")
    sim.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                     help="change one scenario key, dotted (stream.params.beta=0.3, devices.2.speed=20; "
                          "the value is YAML); repeat for more")
    sim.add_argument("--out", help="output folder (default runs/sim-<scenario>-<time>)")
    sim.add_argument("--report", action="store_true", help="render the report when done")
    sim.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="(seed, method) runs at a time, each in a worker process (default 1: one "
                          "after another in this process; with --executor ray, as many as Ray "
                          "schedules); the output files are the same")
    sim.add_argument("--workers", type=int, default=None, metavar="N",
                     help="train each run's device rounds in N worker processes (Ray actors with "
                          "--executor ray): the rounds that cannot change each other's input run "
                          "side by side; the output files are the same")
    sim.add_argument("--keep-going", action="store_true",
                     help="a run that fails is logged, listed in summary.json and left out of the "
                          "figures while the other runs go on (the exit status is then 1); "
                          "default: the first failure ends the grid")
    sim.add_argument("--executor", default="local", choices=("local", "ray"),
                     help="where parallel runs and round workers go: local processes, or Ray "
                          "tasks and actors (needs the ray extra)")
    sim.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="Ray cluster to attach to (default: start a local Ray instance)")
    sim.add_argument("--log-level", default="WARNING")
    tune = _sub(sub, "tune", TUNE_HELP,
                "Runs every method at every rate (the scenario's first seeds), keeps each method's "
                "rate with the best mean accuracy over the run and writes tuned.json and "
                "tuned.flags (--set method_lr.NAME=LR flags for 'streamfl sim') into the folder.")
    tune.add_argument("scenario", help="scenario YAML (see configs/scenarios/)")
    tune.add_argument("--methods", required=True, help="comma-separated methods to tune")
    tune.add_argument("--lrs", default="0.05,0.1,0.2,0.4",
                      help="comma-separated learning rates (default 0.05,0.1,0.2,0.4)")
    tune.add_argument("--seeds", type=int, default=1, help="seeds per rate (default 1)")
    tune.add_argument("--duration", type=float, help="virtual seconds (default: the scenario's)")
    tune.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                      help="change one scenario key, as for 'streamfl sim'")
    tune.add_argument("--jobs", type=int, default=None, metavar="N",
                      help="runs at a time in worker processes (default 1)")
    tune.add_argument("--workers", type=int, default=None, metavar="N",
                      help="each run's device rounds in N worker processes (as for 'streamfl sim')")
    tune.add_argument("--keep-going", action="store_true",
                      help="as for 'streamfl sim': failed runs are listed and the sweep goes on; a "
                           "rate with a failed run is not chosen (the exit status is then 1)")
    tune.add_argument("--also", default="", metavar="NAME=FROM,...",
                      help="methods that take a tuned method's rate in tuned.flags, e.g. an "
                           "ablation: NAME-no-dvfs=NAME")
    tune.add_argument("--out", required=True, help="output folder")
    tune.add_argument("--log-level", default="WARNING")
    report = _sub(sub, "report", REPORT_HELP,
                  "Reads the folder written by 'streamfl sim' (or a coordinator's --run-dir, whose "
                  "summary.json it writes at stop) and writes the plots and the page into it.")
    sections = report_sections()
    report.add_argument("run_dir", nargs="+",
                        help="folder written by 'streamfl sim' or a coordinator's run folder; with a "
                             "section that compares runs, "
                             "several folders (a sweep) print side by side")
    report.add_argument("--markdown", action="store_true",
                        help="print the methods as a Markdown table instead of rendering the report")
    report.add_argument("--reference", default="fedasync",
                        help="method the table compares energy and mean accuracy with (default fedasync)")
    report.add_argument("--section", choices=sorted(sections), default=None, metavar="NAME",
                        help="print a method's own figures instead: %s" % "; ".join(
                            "%s: %s" % (name, sections[name].help) for name in sorted(sections)))
    report.add_argument("--option", default=None, metavar="STRING",
                        help="the section's argument, where it takes one")
    report.add_argument("--overview", action="store_true",
                        help="with --section and several folders: only each folder's change against "
                             "--reference and their mean, where the section has that short form")
    for name in sorted(sections):
        # Deprecated: --NAME [OPTION] was --section NAME [--option OPTION] before sections were
        # the methods' own; kept so that older scripts run.
        if "--" + name not in report._option_string_actions:
            report.add_argument("--" + name, nargs="?", const="", default=None, metavar="OPTION",
                                dest="section_alias_" + name, help=argparse.SUPPRESS)
    report.add_argument("--labels", default=None,
                        help="with several folders: their column labels, comma-separated, in order "
                             "(default: the folder names)")
    report.add_argument("--methods", default=None,
                        help="with --section or --markdown: only these comma-separated methods' "
                             "rows, in this order")
    report.add_argument("--log-level", default="WARNING")
    operator = _sub(sub, "operator", OPERATOR_HELP,
                    "Publishes the command on the fleet's coordinator command topic (QoS 1) and "
                    "waits for the coordinator's answer on its reply topic: 'status' answers with the "
                    "live fleet table; another kind is handled by the plug-ins that know it, and a "
                    "kind nobody handles is an error (exit 1), as is no answer within --timeout. "
                    "pause, resume, logs (--param lines=N) and set (--param name=round_interval_s "
                    "--param value=30) go on to the boards (--devices, default every board the "
                    "coordinator knows), and each board is listed as answered, refused, timed out "
                    "or offline: exit 1 unless every board answered. The "
                    "command is stamped with this machine's clock (the coordinator obeys each stamp "
                    "once, and only a fresh one) and, with --signing-key-file, signed: a "
                    "coordinator that pins operator keys (operator.public_keys) obeys nothing else. "
                    "The shipped broker ACL lets the 'operator' account write that topic and read "
                    "the replies.")
    operator.add_argument("kind", metavar="KIND", help="command kind, as a plug-in of the "
                                                          "coordinator names it")
    operator.add_argument("--param", action="append", default=[], dest="params", metavar="KEY=VALUE",
                          help="one parameter of the command (the value is YAML); repeat for more")
    operator.add_argument("--devices", default=None, metavar="ID,ID",
                          help="pause, resume, logs, set: only these boards (default: every board "
                               "the coordinator knows); the same as --param devices=ID,ID")
    operator.add_argument("--broker", default="localhost", help="MQTT broker host (default localhost)")
    operator.add_argument("--port", type=int, default=1883, help="MQTT broker port (default 1883)")
    operator.add_argument("--fleet", default="default",
                          help="fleet name, as the coordinator's (default: default)")
    operator.add_argument("--username", help="MQTT user name (the shipped ACL's: operator)")
    operator.add_argument("--password-file", help="file whose first line is the MQTT password "
                                                  "(else $STREAMFL_MQTT_PASSWORD)")
    operator.add_argument("--tls-ca", help="CA certificate file (enables TLS)")
    operator.add_argument("--tls-cert", help="client certificate file, for a broker that wants one "
                          "(the operator's from 'streamfl provision' with auth: certificate); with --tls-key")
    operator.add_argument("--tls-key", help="private key file of --tls-cert")
    operator.add_argument("--signing-key-file",
                          help="the operator's Ed25519 private key (PEM, from 'streamfl-coordinator "
                               "keygen --name operator'; its .pub line goes into the coordinator's "
                               "operator.public_keys) that signs the command")
    operator.add_argument("--coordinator-public-key", default=None, metavar="KEY",
                          help="the coordinator's public key (its .pub line): only an answer signed "
                               "by it counts")
    operator.add_argument("--json", action="store_true", help="print the answer as JSON")
    operator.add_argument("--timeout", type=float, default=10.0,
                          help="seconds to wait for the broker and the coordinator's answer (default 10)")
    operator.add_argument("--log-level", default="ERROR",
                          help="default ERROR: a failure is the one line saying why")
    for name, module_name in TOOLS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(_sub(sub, name, module.HELP, module.DETAILS))
    return parser


def _sim(args) -> int:
    """``streamfl sim``: the scenario, the flags over it, the run, the closing lines."""
    import time
    from pathlib import Path

    from streamfl.sim.driver import run_sim
    from streamfl.sim.scenario import load_scenario, parse_sets
    overrides = {"duration_s": args.duration}
    if args.dataset:
        # All of the user's file: the scenario's n_windows subsamples its own dataset only.
        overrides["data"] = {"dataset": "npz", "path": args.dataset, "n_windows": None}
    scenario = load_scenario(Path(args.scenario), overrides, parse_sets(args.sets))
    out = Path(args.out or "runs/sim-%s-%s" % (scenario.name, time.strftime("%Y%m%d-%H%M%S")))
    methods = [m for m in args.methods.split(",") if m.strip()] if args.methods else None
    summary = run_sim(scenario, out, methods=methods, seeds=args.seeds, jobs=args.jobs,
                      executor=args.executor, ray_address=args.ray_address, workers=args.workers,
                      keep_going=args.keep_going)
    for name, m in summary["methods"].items():
        if not m["runs"]:
            print("%-16s failed in every seed (below)" % name)
            continue
        print("%-16s accuracy %s +- %s   mean over the run %s +- %s   energy %s +- %s J%s" % (
            name, _fmt(m.get("final_accuracy")), _fmt(m.get("final_accuracy_std")),
            _fmt(m.get("mean_accuracy")), _fmt(m.get("mean_accuracy_std")),
            _fmt(m.get("energy_j"), "%.0f"), _fmt(m.get("energy_j_std"), "%.0f"),
            "   (%d seed(s) failed)" % len(m["failed"]) if m.get("failed") else ""))
    print("run folder: %s" % out)
    if args.report:
        from streamfl.sim.report_html import render_report
        print("report: %s" % render_report(out))
    return _failed_runs([(name, f) for name, entry in summary["methods"].items()
                         for f in entry.get("failed", [])])


def _tune(args) -> int:
    """``streamfl tune``: the sweep, its table, where its flags are."""
    from pathlib import Path

    from streamfl.config import parse_value
    from streamfl.sim.scenario import load_scenario, parse_sets
    from streamfl.sim.tuning import tune_lr, tuning_table
    scenario = load_scenario(Path(args.scenario), {"duration_s": args.duration}, parse_sets(args.sets))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    lrs = [parse_value(x, "--lrs") for x in args.lrs.split(",") if x.strip()]
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in lrs):
        raise ConfigError("--lrs: comma-separated numbers, got %r" % args.lrs)
    also = {}
    for item in (x.strip() for x in args.also.split(",") if x.strip()):
        name, sep, source = item.partition("=")
        if not sep or not name or not source:
            raise ConfigError("--also %r: expected NAME=FROM" % item)
        also[name] = source
    result = tune_lr(scenario, methods, [float(x) for x in lrs], Path(args.out), seeds=args.seeds,
                     jobs=args.jobs, also=also, workers=args.workers, keep_going=args.keep_going)
    print(tuning_table(result))
    print("flags for streamfl sim: %s" % (Path(args.out) / "tuned.flags"))
    return _failed_runs([("%s at lr %s" % (name, lr), f) for name, r in result.items()
                         for lr, figures in r["sweep"].items() for f in figures.get("failed", [])])


def _failed_runs(failures) -> int:
    """The exit status of a grid: 1, with each failed run named on stderr, if any run failed."""
    import sys
    for name, failure in failures:
        print("failed: %s seed %d: %s" % (name, failure["seed"], failure["error"]), file=sys.stderr)
    if failures:
        print("%d run(s) failed and are left out of the figures" % len(failures), file=sys.stderr)
    return 1 if failures else 0


def _operator(args) -> int:
    """``streamfl operator KIND``: the command, the broker's settings from the flags, the send."""
    import os
    import re
    from dataclasses import replace
    from pathlib import Path

    from streamfl.config import parse_value
    from streamfl.operator import send_operator_command
    from streamfl.protocol.messages import COMMAND_KIND_RE
    from streamfl.protocol.transport.config import MqttConfig
    if not re.match(COMMAND_KIND_RE, args.kind):
        raise ConfigError("invalid command kind %r: a lower-case letter, then up to 63 of a-z 0-9 "
                          "_ . -" % args.kind)
    params = {}
    for item in args.params:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError("--param %r: expected KEY=VALUE" % item)
        params[key] = parse_value(text, "--param " + key)
    if not args.timeout > 0:
        raise ConfigError("--timeout must be > 0, got %r" % args.timeout)
    from streamfl.protocol.messages import FLEET_CONTROL_KINDS
    fleet_control = args.kind in FLEET_CONTROL_KINDS
    if args.devices is not None:
        if not fleet_control:
            raise ConfigError("--devices is for %s, not %s" % (", ".join(FLEET_CONTROL_KINDS), args.kind))
        params["devices"] = args.devices
    if fleet_control:  # the boards' wait ends before ours, so the coordinator's answer can come
        params.setdefault("wait_s", round(max(0.5, min(args.timeout * 0.8, args.timeout - 1.0)), 3))
    try:
        mqtt = MqttConfig(host=args.broker, port=args.port, username=args.username,
                          password_file=Path(args.password_file) if args.password_file else None,
                          tls_ca=Path(args.tls_ca) if args.tls_ca else None,
                          tls_cert=Path(args.tls_cert) if args.tls_cert else None,
                          tls_key=Path(args.tls_key) if args.tls_key else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings = replace(mqtt.settings("streamfl-operator-%d" % os.getpid(), os.environ),
                       persistent_session=False)
    reply = send_operator_command(settings, args.fleet, args.kind, params, args.timeout,
                                  signing_key_file=args.signing_key_file,
                                  coordinator_public_key=args.coordinator_public_key)
    if args.json:
        import json
        print(json.dumps({"kind": reply.kind, "ok": reply.ok, "handled_by": reply.handled_by,
                          "error": reply.error, "result": reply.result}, indent=1))
    elif fleet_control and "devices" in reply.result:
        from streamfl.fleet_control_view import render_boards
        print(render_boards(reply.kind, reply.result))
        if not reply.ok:
            print("streamfl: %s: %s" % (args.kind, reply.error), file=sys.stderr)
    elif not reply.ok:
        print("streamfl: the coordinator of fleet %s did not act on %s: %s"
              % (args.fleet, args.kind, reply.error), file=sys.stderr)
    elif args.kind == "status":
        import shutil

        from streamfl.status import render
        print(render(reply.result, width=shutil.get_terminal_size((120, 40)).columns))
    else:
        print("%s: handled by %s%s" % (args.kind, ", ".join(reply.handled_by),
                                       (" " + str(reply.result)) if reply.result else ""))
    return 0 if reply.ok else 1


def _section(args):
    """The report section asked for and its option string: ``--section NAME [--option STRING]``
    or the deprecated ``--NAME [STRING]``; ``(None, "")`` for none."""
    aliases = {key[len("section_alias_"):]: value for key, value in vars(args).items()
               if key.startswith("section_alias_") and value is not None}
    if len(aliases) + (args.section is not None) > 1:
        raise ConfigError("one report section at a time, got %s" % ", ".join(
            sorted(aliases) + ([args.section] if args.section else [])))
    if aliases:
        (name, option), = aliases.items()
        if args.option is not None:
            raise ConfigError("--%s takes its option itself, not from --option" % name)
        return name, option
    if args.section is None:
        if args.option is not None:
            raise ConfigError("--option goes with --section")
        return None, ""
    return args.section, args.option or ""


def _fmt(value, pattern: str = "%.3f") -> str:
    return "-" if value is None else pattern % value


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup_logging(getattr(args, "log_level", "WARNING"))
        if args.command == "demo":
            from streamfl.sim.demo import DemoOptions, run_demo
            opts = DemoOptions(agents=args.agents, duration_s=args.duration, run_dir=args.run_dir,
                               model=args.model, strategy=args.strategy,
                               dvfs_policy=args.dvfs_policy,
                               broker=None if args.broker == "auto" else args.broker)
            summary = run_demo(opts)
            return 0 if summary.get("ok", False) else 1
        if args.command == "sim":
            return _sim(args)
        if args.command == "tune":
            return _tune(args)
        if args.command == "operator":
            return _operator(args)
        if args.command in TOOLS:
            return importlib.import_module(TOOLS[args.command]).run(args)
        if args.command == "report":
            from pathlib import Path

            rows = [m.strip() for m in args.methods.split(",")] if args.methods else None
            dirs = [Path(d) for d in args.run_dir]
            section, option = _section(args)
            labels = [x for x in args.labels.split(",") if x.strip()] if args.labels else None
            if section is not None:
                if len(dirs) > 1 and not report_sections()[section].many_runs:
                    raise ConfigError("section %s takes one run folder" % section)
                print(report_renderer(section)(dirs, rows, option, reference=args.reference,
                                               labels=labels, overview=args.overview))
                return 0
            if len(dirs) > 1:
                raise ConfigError("several run folders go with these sections only: %s" % ", ".join(
                    name for name, s in sorted(report_sections().items()) if s.many_runs))
            if args.markdown:
                from streamfl.sim.tables import markdown_for_run
                print(markdown_for_run(dirs[0], args.reference, rows))
                return 0
            from streamfl.sim.report_html import render_report
            print("report: %s" % render_report(dirs[0]))
    except ConfigError as exc:
        print("streamfl: configuration error: %s" % exc, file=sys.stderr)
        return ConfigError.exit_code
    except StreamflError as exc:
        print("streamfl: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
