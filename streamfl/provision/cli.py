"""``streamfl provision``: the sub-command's options and its run (``streamfl.cli`` TOOLS)."""
import sys
from pathlib import Path

from streamfl.errors import ConfigError

HELP = "make a fleet's CA, broker config, accounts, coordinator YAML and one kit per board"
DETAILS = ("Reads a fleet file (the fleet's name, the broker's host names and port, the boards as "
           "a list of ids and kinds or a count and a prefix, auth password or certificate) and "
           "writes into --out: a CA, the broker's certificate, config, ACL and password file (or "
           "CRL), passwords or client certificates for the coordinator, its probe, the operator "
           "and the dashboard, the coordinator's YAML and signing key, an operator key, and "
           "kits/<id>/ per board (agent.yaml, credentials, install script). Run again with more "
           "boards to add them: nothing issued is re-made. --revoke ID takes a board out of the "
           "broker's files. Exit 2 on a wrong fleet file, naming the key.")


def add_arguments(parser) -> None:
    parser.add_argument("fleet_file", nargs="?", type=Path,
                        help="the fleet file (YAML; see configs/fleet.example.yaml)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the output folder (made; a re-run keeps what it holds)")
    parser.add_argument("--port", type=int, default=None,
                        help="the broker's port instead of the fleet file's broker.port")
    parser.add_argument("--revoke", action="append", default=[], metavar="ID",
                        help="revoke this board (repeat for more): out of the password file or "
                             "into the CRL, out of the ACL; the record stays")
    parser.add_argument("--reason", default="", help="with --revoke: why, kept in the record")
    parser.add_argument("--shipped-broker-dir", type=Path, default=None,
                        help="the folder of the shipped streamfl.conf and acl (default: the "
                             "package's, else the source tree's configs/mosquitto)")
    parser.add_argument("--log-level", default="WARNING")


def run(args) -> int:
    from streamfl.provision import fleet_file, report
    from streamfl.provision.coordinator_files import OPERATOR_KEY, operator_command
    from streamfl.provision.provisioner import Provisioner
    if args.revoke and args.fleet_file is not None:
        raise ConfigError("--revoke takes no fleet file: it changes the folder's broker files only")
    if not args.revoke and args.fleet_file is None:
        raise ConfigError("give the fleet file (or --revoke ID)")
    provisioner = Provisioner(args.out, args.shipped_broker_dir)
    if args.revoke:
        outcome = provisioner.revoke(args.revoke, args.reason)
    else:
        spec = fleet_file.load(args.fleet_file, args.port)
        outcome = provisioner.provision(spec)
    reg, L = provisioner.registry, provisioner.layout
    broker = reg.get("broker") or {}
    if reg.get("auth") == "certificate":
        crt, key = L.role_cert("operator")
        creds = ["--tls-cert", str(crt), "--tls-key", str(key)]
    else:
        creds = ["--username", "operator", "--password-file", str(L.role_password("operator"))]
    status = operator_command("status", broker["hosts"][0], broker["port"], reg.get("fleet"),
                              L.operator / "ca.crt", creds, L.operator / (OPERATOR_KEY + ".key"),
                              reg.get("coordinator_public_key"))
    provisioner.files.always(L.out / "README.md",
                             report.readme(outcome, reg, status).encode("utf-8"), 0o644)
    for line in report.summary(outcome, reg):
        print(line, file=sys.stdout)
    return 0
