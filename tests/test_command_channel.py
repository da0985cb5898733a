"""The command channel end to end over a real broker: a coordinator plug-in's command reaches an
agent on its command topic (QoS 1, not retained) and changes what the agent's next round does.

Both programs run in this process (so a test plug-in can be registered for the run) with their
real runtimes, ``CoordinatorServer`` and ``AgentDaemon``, over paho and mosquitto.
"""
import threading
import time
from dataclasses import dataclass

import pytest

from polling import wait_until

from streamfl.agent.config import AgentConfig
from streamfl.agent.daemon import AgentDaemon
from streamfl.config import build
from streamfl import methods
from streamfl.coordinator.config import CoordinatorConfig
from streamfl.methods.base import MethodPackage
from streamfl.coordinator.plugins.base import Addressed, CoordinatorPlugin, Effects, Verdict
from streamfl.coordinator.server import CoordinatorServer
from streamfl.models import ModelSpec
from streamfl.protocol.messages import Command, Update
from streamfl.protocol.transport.base import MqttSettings
from streamfl.protocol.transport.paho import PahoTransport
from streamfl.sensors import make_source

SPEC = ModelSpec(name="mlp", in_channels=6, window_len=50, num_classes=6, hidden=8)
FLEET = "cmd"
DEV = "board-1"


@dataclass(frozen=True)
class PauseConfig:
    """How long the device is told to sit out after its first update."""

    pause_s: float = 2.0


class PausePlugin(CoordinatorPlugin):
    """Tells a device to skip rounds after its first update, and to train again ``pause_s`` later."""

    name = "test-pause"
    Config = PauseConfig

    def __init__(self, config, fleet, peers):
        super().__init__(config, fleet, peers)
        self.paused_at = {}
        self.resumed = set()

    def on_update_admitted(self, update: Update, now: float) -> Verdict:
        if update.device_id in self.paused_at:
            return Verdict()
        self.paused_at[update.device_id] = now
        return Verdict(commands=(Addressed(update.device_id, Command("skip", {"rounds": 100000})),))

    def on_tick(self, now: float) -> Effects:
        due = [d for d, t in self.paused_at.items() if d not in self.resumed and now - t >= self.config.pause_s]
        self.resumed.update(due)
        return Effects(commands=tuple(Addressed(d, Command("train")) for d in due))


@pytest.fixture
def pause_plugin():
    methods.register(MethodPackage(name=PausePlugin.name, summary="pauses each device once",
                                   package=__name__, coordinator=":PausePlugin"))
    try:
        yield PausePlugin
    finally:
        methods.unregister(PausePlugin.name)


def _settings(broker, client_id):
    return MqttSettings(host=broker.host, port=broker.port, client_id=client_id,
                        reconnect_min_s=0.2, reconnect_max_s=1.0)


@pytest.mark.timeout(120)
def test_a_plugin_command_reaches_the_agent_and_changes_its_next_round(mqtt_broker, tmp_path, pause_plugin):
    config = build(CoordinatorConfig, {"fleet": FLEET, "model": SPEC, "persist_interval_s": 0.5,
                                       "plugins": {"test-pause": {"pause_s": 3.0}}}, "test")
    server = CoordinatorServer(config, PahoTransport(_settings(mqtt_broker, "coordinator")),
                               tmp_path / "coord-state", tmp_path / "run")
    agent_config = build(AgentConfig, {
        "fleet": FLEET, "device_id": DEV, "model": SPEC, "min_buffer": 16, "round_interval_s": 0.1,
        "local_steps": 2, "batch_size": 8, "telemetry_interval_s": 0.0,
        "sensor": {"windows_per_s": 400.0, "schedule": "all"}}, "test")
    transport = PahoTransport(_settings(mqtt_broker, DEV))
    daemon = AgentDaemon(agent_config, transport, make_source(agent_config.sensor, DEV), tmp_path / "agent")
    server.start()
    agent_thread = threading.Thread(target=daemon.run, daemon=True)
    agent_thread.start()
    try:
        wait_until(lambda: daemon.counters["commands_received"] >= 1, 60, "the skip command at the agent")
        plugin = server.core.plugins[0]
        paused_at = time.monotonic()
        assert daemon.core.skipping
        rounds_at_pause = daemon.core.rounds
        time.sleep(1.5)       # 15 round intervals: a running agent would have trained many rounds
        assert daemon.core.rounds <= rounds_at_pause + 1, "the agent kept training through its skip"
        wait_until(lambda: daemon.counters["commands_received"] >= 2, 30, "the train command at the agent")
        assert time.monotonic() - paused_at >= 1.0 and plugin.resumed == {DEV}
        wait_until(lambda: daemon.core.rounds >= rounds_at_pause + 3, 30, "rounds after the train command")
        assert not daemon.core.skipping
        assert server.counters()["commands_sent"] == 2 and server.counters()["command_failures"] == 0
    finally:
        daemon.stop()
        agent_thread.join(30)
        server.stop()
