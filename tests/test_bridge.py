"""Two mosquitto brokers bridged with the shipped configs/mosquitto/bridge-site.conf: agents on the
site broker, the coordinator on the root broker. Cutting the bridge link, then stopping and
restarting the site broker, loses no update the agents made, and models reach the site again."""
import re
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from fleet import FleetRun, ModelWatcher
from netproxy import CuttableProxy
from streamfl.sim.brokers import BrokerProcess

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "mosquitto"
SHIPPED_BRIDGE = CONFIGS / "bridge-site.conf"
SHIPPED_ROOT_ACL = CONFIGS / "root-bridge.acl"
#: Lines of the shipped bridge a loopback test cannot keep: the root here speaks plain TCP to an
#: account without a password file (the root's ACL still applies to the bridge's user name).
DROPPED_KEYS = ("bridge_cafile", "bridge_certfile", "bridge_keyfile", "bridge_insecure",
                "bridge_tls_version", "remote_password")
#: The shipped jitter (1 s to 10 s) could make one reconnect alone take 10 s; the test keeps the
#: same backoff kind with a 2 s cap so it stays short.
TEST_RESTART_TIMEOUT = "restart_timeout 1 2"
ROUND_RE = re.compile(r"streamfl\.agent\.core: round (\d+) from v(\d+): \d+ samples, loss ([-0-9.naif]+)")
QUEUED = "broker unreachable: update queued"


def site_bridge_config(root_host: str, root_port: int) -> str:
    """The shipped bridge file with the root's address on loopback and its TLS lines dropped."""
    out, keys = [], set()
    for line in SHIPPED_BRIDGE.read_text().splitlines():
        words = line.split()
        key = words[0] if words and not words[0].startswith("#") else None
        if key in DROPPED_KEYS:
            continue
        if key == "address":
            line = "address %s:%d" % (root_host, root_port)
        elif key == "restart_timeout":
            line = TEST_RESTART_TIMEOUT
        keys.add(key)
        out.append(line)
    missing = {"connection", "address", "cleansession", "local_cleansession", "try_private",
               "topic"} - keys
    assert not missing, "the shipped bridge lacks %s" % sorted(missing)
    return "\n".join(out) + "\n"


def root_acl(path: Path) -> Path:
    """Anonymous clients (the coordinator, the test's watcher) read and write the fleet's topics;
    the bridge account gets exactly the shipped root-bridge.acl lines."""
    path.write_text("topic readwrite streamfl/v1/#\n\n" + SHIPPED_ROOT_ACL.read_text())
    return path


def agent_rounds(run: FleetRun, index: int) -> List[Tuple[int, int, float]]:
    """(round, base version, loss) of every round the agent logged (each made one update)."""
    return [(int(r), int(v), float(loss)) for r, v, loss in ROUND_RE.findall(
        run.agents[index].log_text())]


def unmatched(run: FleetRun, made: Dict[str, List[Tuple[int, int, float]]]) -> List[tuple]:
    """The agents' rounds with no update of the same device, base version and loss (the log's
    four decimals) in the coordinator's metrics.jsonl."""
    received: Dict[Tuple[str, int], List[float]] = {}
    for u in run.updates():
        received.setdefault((u["device"], int(u["base_version"])), []).append(float(u["loss"]))
    missing = []
    for device, rounds in made.items():
        for rnd, base, loss in rounds:
            pool = received.get((device, base), [])
            hit = next((i for i, got in enumerate(pool) if abs(got - loss) <= 6e-5), None)
            if hit is None:
                missing.append((device, rnd, base, loss))
            else:
                pool.pop(hit)
    return missing


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_site_broker_bridged_to_root_loses_no_update_across_link_cut_and_site_restart(tmp_path):
    root = BrokerProcess(tmp_path / "root", kind="mosquitto",
                         extra_config="acl_file %s" % root_acl(tmp_path / "root.acl"))
    root.start()
    link = CuttableProxy(root.host, root.port)            # the site's uplink, cuttable
    site = BrokerProcess(tmp_path / "site", kind="mosquitto",
                         extra_config=site_bridge_config(root.host, link.port))
    run = FleetRun(tmp_path / "fleet", root.host, root.port)
    watcher = None
    try:
        site.start()
        run.start_coordinator()
        for i in (0, 1):
            run.start_agent(i, port=site.port)
        devices = {i: run.device_id(i) for i in (0, 1)}
        watcher = ModelWatcher(site.host, site.port, run.fleet, run.spec, client_id="site-watcher")

        def per_device(at_least: int) -> bool:
            got = [u["device"] for u in run.updates()]
            return all(got.count(d) >= at_least for d in devices.values())
        run.wait_for(lambda: per_device(2) and run.version() >= 3, 60,
                     "two updates per site device at the root's coordinator")
        run.wait_for(lambda: watcher.models(), 10, "a model reaching the site broker")

        # 1. The uplink goes: the devices stay connected to the site, which acknowledges their
        # updates and queues them for the bridge; nothing reaches the coordinator meanwhile.
        link.cut()
        rounds_at_cut = {i: len(agent_rounds(run, i)) for i in devices}
        run.wait_for(lambda: all(len(agent_rounds(run, i)) >= rounds_at_cut[i] + 2 for i in devices),
                     30, "two rounds per agent while the uplink is cut")
        made_in_cut = {devices[i]: agent_rounds(run, i)[rounds_at_cut[i]:] for i in devices}
        crossed = sum(len(r) for r in made_in_cut.values()) - len(unmatched(run, made_in_cut))
        assert crossed == 0, "%d updates crossed a cut uplink\n%s" % (crossed, run.diagnostics())
        link.restore()
        run.wait_for(lambda: not [m for m in unmatched(run, made_in_cut)], 30,
                     "the updates made while the uplink was cut, at the coordinator")

        # 2. The site broker goes: the agents keep training into their outboxes; it comes back
        # on the same port with its persistence, and the bridge reconnects.
        queued_before = {i: run.agents[i].log_text().count(QUEUED) for i in devices}
        site.stop()
        run.wait_for(lambda: all(run.agents[i].log_text().count(QUEUED) >= queued_before[i] + 2
                                 for i in devices), 30, "two updates per agent queued in its outbox")
        version_at_restart = run.version()
        restarted_at = time.monotonic()
        site.start()

        # Nothing lost: every round any agent logged up to now reaches the coordinator.
        made = {devices[i]: agent_rounds(run, i) for i in devices}
        run.wait_for(lambda: not unmatched(run, made), 40,
                     "every update the agents made at the coordinator")
        # Models flow to the site again, and the agents train from them.
        run.wait_for(lambda: [m for m in watcher.models(restarted_at)
                              if m.version > version_at_restart], 30,
                     "a model newer than v%d at the site broker" % version_at_restart)
        run.wait_for(lambda: all(any(base > version_at_restart for _, base, _ in agent_rounds(run, i))
                                 for i in devices), 30,
                     "each agent training from a model newer than v%d" % version_at_restart)
        # The model is retained on the site too (try_private): a board connecting to the site now
        # gets the newest model the site has relayed, not the one current when the bridge connected.
        newest = run.wait_for(lambda: max((m.version for m in watcher.models(restarted_at)
                                           if m.version >= version_at_restart + 3), default=None),
                              30, "three more versions at the site broker")
        late_joiner = ModelWatcher(site.host, site.port, run.fleet, run.spec, client_id="late-joiner")
        try:
            retained = run.wait_for(lambda: late_joiner.models(), 10, "the site's retained model")
            assert retained[0].version >= newest, (retained[0].version, newest)
        finally:
            late_joiner.close()
        run.check_alive()
    finally:
        if watcher is not None:
            watcher.close()
        run.stop_all()
        site.stop()
        link.close()
        root.stop()
