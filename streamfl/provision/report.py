"""What a provisioning run tells its user: the output folder's README.md (the commands of this very
fleet, with its paths) and the lines printed on stdout."""
from pathlib import Path
from typing import List

from streamfl.provision import kits
from streamfl.provision.registry import Registry


def _start_commands(out: Path, fleet: str, first_board: str) -> List[str]:
    return [
        "mosquitto -c %s" % (out / "broker" / "mosquitto.conf"),
        "streamfl-coordinator --config %s --state-dir %s --run-dir runs/%s" % (
            out / "coordinator" / "coordinator.yaml", out / "coordinator" / "state", fleet),
        "sudo sh kits/%s/install_board.sh --wheelhouse dist/wheelhouse/<target> --kit kits/%s"
        % (first_board, first_board),
    ]


def readme(outcome, registry: Registry, operator_status: str) -> str:
    """The output folder's README.md."""
    out = outcome.out
    active, revoked = registry.active_boards(), registry.revoked_boards()
    broker = registry.get("broker") or {}
    cert = registry.get("auth") == "certificate"
    first = active[0] if active else "<id>"
    start = _start_commands(out, registry.get("fleet"), first)
    lines = [
        "# Fleet %s" % registry.get("fleet"), "",
        "Made by `streamfl provision` (re-run it with the same `--out` to add boards: every key, "
        "certificate and password here is kept). Clients authenticate with %s; the broker listens "
        "on port %s%s and its certificate names %s." % (
            "client certificates (CN = account)" if cert else "passwords", broker.get("port"),
            " (%s)" % broker["bind"] if broker.get("bind") else "",
            ", ".join(broker.get("hosts") or [])), "",
        "Boards (%d): %s." % (len(active), ", ".join(active) or "none"),
    ]
    if revoked:
        lines.append("Revoked (%d): %s." % (len(revoked), ", ".join(revoked)))
    lines += ["", "## Run it", "", "```sh"]
    lines.append("%s      # the broker (foreground; as root it drops to the mosquitto user)" % start[0])
    lines.append(start[1])
    lines.append("# on each board, with its kit folder copied there (scp -r kits/<id> ...):")
    lines.append(start[2])
    lines += ["```", ""]
    if outcome.chown:
        lines += ["A mosquitto started as root (`sudo`, or the system service) drops to the "
                  "`mosquitto` user and must own what it reads and writes:", "", "```sh"]
        lines += outcome.chown + ["```", ""]
    lines += [
        "Operator commands (signed with the operator key the coordinator pins):", "", "```sh",
        operator_status, "```", "",
        "## Change it", "",
        "- more boards: add them to the fleet file and run `streamfl provision FLEET_FILE --out %s` "
        "again, then `kill -HUP` the broker (it re-reads its password file and ACL)." % out,
        "- a lost or stolen board: `streamfl provision --revoke ID --out %s`, which takes it out "
        "of the %s and the ACL and keeps the record in fleet-state.json; then %s." % (
            out, "CRL" if cert else "password file",
            "`kill -HUP` the broker: it re-reads the CRL and the ACL and refuses the board's next "
            "connection; a live one lasts until it drops, so restart the broker to end it now"
            if cert else "`kill -HUP` the broker: it re-reads both files and drops the board's "
            "connection"),
        "", "## Files", "",
        "- `ca/ca.key`: the fleet CA's key. Keep it off the broker, backed up and secret: it "
        "signs every certificate here.",
        "- `broker/`: the broker's config (the shipped one, paths rewritten), ACL, %s, "
        "certificate and key, `data/` and `log/`." % ("CRL" if cert else "password file"),
        "- `coordinator/`: `coordinator.yaml`, its signing key (`coordinator-signing.key`, 0600) and "
        "the credentials of the `coordinator` and `coordinator-probe` accounts.",
        "- `operator/`, `dashboard/`: the other two accounts (`operator-signing.key` signs "
        "operator commands).",
        "- `kits/<id>/`: one per board: `%s`, `%s`, %s, `%s` and a README.txt." % (
            kits.AGENT_YAML, kits.CA_FILE,
            "`%s` and `%s`" % (kits.CERT_FILE, kits.KEY_FILE) if cert else "`%s`" % kits.PASSWORD_FILE,
            kits.INSTALL_SCRIPT),
        "- `fleet-state.json`: what was issued and revoked (no secrets).", ""]
    return "\n".join(lines)


def summary(outcome, registry: Registry) -> List[str]:
    """The lines printed at the end of a run."""
    out = outcome.out
    lines = []
    if outcome.revoked_now:
        lines.append("revoked: %s (%s)" % (", ".join(outcome.revoked_now), "CRL and ACL"
                                             if registry.get("auth") == "certificate"
                                             else "password file and ACL"))
        lines.append("reload the broker now: kill -HUP $(pidof mosquitto)  (or systemctl reload "
                     "mosquitto)%s" % (
                         ": it refuses the board's next connection; restart it to end a live one"
                         if registry.get("auth") == "certificate" else
                         ": it drops the board's connection and refuses the next"))
    else:
        lines.append("fleet %s (%s): %d boards: %d new, %d kept%s" % (
            outcome.fleet, outcome.auth, len(registry.active_boards()), len(outcome.new_boards),
            len(outcome.kept_boards), ", %d revoked" % len(outcome.revoked) if outcome.revoked else ""))
    files = outcome.files
    if files is not None and not outcome.revoked_now:
        lines.append("files in %s: %d made, %d kept, %d rewritten" % (
            out, len(files.created), len(files.kept), len(files.changed)))
    for board_id in outcome.skipped_revoked:
        lines.append("warning: %s is revoked: no kit made (a revoked id is not issued again; give "
                     "the board a new id)" % board_id)
    for board_id in outcome.not_in_file:
        lines.append("warning: %s is not in the fleet file but still issued (its kit and broker "
                     "entries stay): revoke it with --revoke %s" % (board_id, board_id))
    if not outcome.install_script and not outcome.revoked_now:
        lines.append("warning: this streamfl has no board install script (package %s, %s): the "
                     "kits have no %s" % (kits.SCRIPT_PACKAGE, kits.INSTALL_SCRIPT, kits.INSTALL_SCRIPT))
    for note in outcome.notes:
        lines.append("note: %s" % note)
    if outcome.chown:
        lines.append("to start this broker as root (it then runs as the mosquitto user), first run:")
        lines.extend("  " + c for c in outcome.chown)
    lines.append("next: see %s" % (out / "README.md"))
    return lines
