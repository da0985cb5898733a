"""The ``streamfl`` command: tools around the fleet (``demo`` now; ``sim`` and ``report`` later)."""
import argparse
import sys
from typing import List, Optional

from streamfl import __version__
from streamfl.errors import ConfigError, StreamflError
from streamfl.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamfl", description=__doc__)
    parser.add_argument("--version", action="version", version="streamfl " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    demo = sub.add_parser("demo", help="run a broker, a coordinator and N agents on this machine")
    demo.add_argument("--agents", type=int, default=3, help="number of agent processes (default 3)")
    demo.add_argument("--duration", type=float, default=120.0,
                      help="seconds of federated training after start-up (default 120)")
    demo.add_argument("--run-dir", default=None, help="output folder (default runs/demo-<time>)")
    demo.add_argument("--model", default="lstm", help="model architecture (lstm, cnn1d, mlp)")
    demo.add_argument("--strategy", default="fedasync", choices=("fedasync", "fedavg"))
    demo.add_argument("--broker", default="auto", choices=("auto", "mosquitto", "amqtt"),
                      help="broker to start: mosquitto when on PATH, else embedded amqtt")
    demo.add_argument("--log-level", default="INFO")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup_logging(args.log_level)
        if args.command == "demo":
            from streamfl.sim.demo import DemoOptions, run_demo
            opts = DemoOptions(agents=args.agents, duration_s=args.duration, run_dir=args.run_dir,
                               model=args.model, strategy=args.strategy,
                               broker=None if args.broker == "auto" else args.broker)
            summary = run_demo(opts)
            return 0 if summary.get("ok", False) else 1
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
