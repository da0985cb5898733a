"""Signatures on models and commands: only the pinned coordinator key, only for the topic signed for."""
import os
import stat

import pytest

from factories import SPEC, make_global_model
from streamfl.coordinator.cli import main as coordinator_main
from streamfl.errors import ConfigError, ProtocolError
from streamfl.protocol.codec import Decoder, encode
from streamfl.protocol.messages import Command
from streamfl.protocol.signing import (
    BAD_SIGNATURE, UNSIGNED, Ed25519Signer, NullSigner, NullVerifier, generate_key_pair, make_signer,
    make_verifier, parse_public_key,
)
from streamfl.models import tensor_spec

TOPIC = "streamfl/v1/lab/device/pi-01/command"


@pytest.fixture
def keys(tmp_path):
    key_path, pub_path, public = generate_key_pair(tmp_path / "keys")
    return key_path, public


def test_signed_frames_open_only_with_the_pinned_key_on_their_topic(keys, tmp_path):
    key_path, public = keys
    signer, verifier = make_signer(str(key_path)), make_verifier(public)
    frame = encode(Command("skip", {"rounds": 3}, run_id="r1", seq=7))
    payload = signer.sign(TOPIC, frame)
    assert verifier.open(TOPIC, payload) == frame
    with pytest.raises(ProtocolError) as err:                  # replayed on another device's topic
        verifier.open(TOPIC.replace("pi-01", "pi-02"), payload)
    assert err.value.reason == BAD_SIGNATURE
    tampered = bytearray(payload)
    tampered[-3] ^= 1
    with pytest.raises(ProtocolError, match=BAD_SIGNATURE):
        verifier.open(TOPIC, bytes(tampered))
    with pytest.raises(ProtocolError, match=UNSIGNED):
        verifier.open(TOPIC, frame)
    with pytest.raises(ProtocolError, match=BAD_SIGNATURE):
        verifier.open(TOPIC, payload[:40])
    _, _, other = generate_key_pair(tmp_path / "other")        # another coordinator's key
    with pytest.raises(ProtocolError, match=BAD_SIGNATURE):
        make_verifier(other).open(TOPIC, payload)


def test_without_keys_frames_pass_and_signed_ones_are_unwrapped(keys):
    key_path, _ = keys
    frame = encode(make_global_model(SPEC, 3, run_id="abc"))
    assert NullSigner().sign(TOPIC, frame) == frame
    signed = Ed25519Signer.from_file(key_path).sign("streamfl/v1/lab/model", frame)
    for payload in (frame, signed):
        opened = NullVerifier().open("streamfl/v1/lab/model", payload)
        gm = Decoder({SPEC.arch_id: tensor_spec(SPEC)}).decode(opened)
        assert gm.version == 3 and gm.run_id == "abc"


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path, capsys):
    assert coordinator_main(["keygen", "--out", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("coordinator_public_key: "))
    parse_public_key(line.split(": ", 1)[1])
    key = tmp_path / "k" / "coordinator-signing.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert coordinator_main(["keygen", "--out", str(tmp_path / "k")]) == 2     # never overwrites
    assert "refusing to overwrite" in capsys.readouterr().err


def test_bad_keys_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="ed25519:"):
        parse_public_key("ssh-ed25519 AAAA")
    with pytest.raises(ConfigError, match="not an Ed25519"):
        parse_public_key("ed25519:AAAA")
    (tmp_path / "k.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="PEM"):
        make_signer(str(tmp_path / "k.pem"))
    with pytest.raises(ConfigError, match="cannot read"):
        make_signer(str(tmp_path / "missing.pem"))
