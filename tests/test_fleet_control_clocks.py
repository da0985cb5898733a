"""A paused board is not left throttled: on a fake Jetson tree with the powersave policy (every
round lowers the clocks), an operator's ``pause`` puts every clock back to its original while
the agent keeps running, sends no update and says ``paused`` in its telemetry; ``resume`` makes
the next round lower them again."""
import time

from polling import wait_until
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command, DeviceReply
from streamfl.protocol.transport.memory import MemoryBroker, MemoryTransport
from test_agent_daemon import DEV, FakeCoordinator, Running
from test_agent_dvfs import board_dvfs
from test_dvfs_domains import tree_files


def test_pause_restores_the_clocks_and_resume_lowers_them_again(tmp_path):
    dvfs, root = board_dvfs(tmp_path)
    before = tree_files(root)
    broker = MemoryBroker()
    coord = FakeCoordinator(broker)
    replies = []
    listener = MemoryTransport(broker, "reply-listener")
    listener.on_message = lambda topic, payload: replies.append(Decoder({}).decode(payload))
    listener.subscribe(coord.topics.device(DEV, "reply"))
    listener.connect()
    coord.publish_model(1)

    def command(kind, seq):
        coord.t.publish(coord.topics.device(DEV, "command"), encode(Command(kind, run_id="", seq=seq)), qos=1)
        wait_until(lambda: any(r.seq == seq for r in replies), what="the answer to %s" % kind)
        return next(r for r in replies if r.seq == seq)

    with Running(broker, tmp_path / "state", agent_dvfs=dvfs, dvfs={"policy": "powersave"}):
        wait_until(lambda: len(coord.updates) >= 2 and tree_files(root) != before, what="throttled rounds")
        reply = command("pause", 1)
        assert isinstance(reply, DeviceReply) and reply.ok and reply.result["paused"] is True
        wait_until(lambda: tree_files(root) == before, what="the clocks back while paused")
        time.sleep(0.5)  # a round in flight when the pause came has finished by now
        sent = len(coord.updates)
        wait_until(lambda: any(t.paused for t in coord.telemetry), what="telemetry saying paused")
        time.sleep(1.0)  # ten round intervals
        assert len(coord.updates) == sent and tree_files(root) == before
        assert command("resume", 2).result == {"paused": False, "was_paused": True}
        wait_until(lambda: len(coord.updates) > sent and tree_files(root) != before,
                   what="throttled rounds again after resume")
    assert tree_files(root) == before
    listener.close()
