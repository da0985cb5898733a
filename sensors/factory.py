"""Build the sensor source a ``SensorConfig`` names, so the agent and the simulator share one switch."""
from pathlib import Path
from typing import Optional

from streamfl.errors import SensorError
from streamfl.sensors.base import Clock, SensorSource, as_clock
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.schedule import AllClasses, ClassSchedule, Rotating


def user_id_for(cfg: SensorConfig, device_id: str) -> int:
    """``cfg.user_id``, or a stable id derived from the device id."""
    from streamfl.sensors.synthetic import user_for_device

    return cfg.user_id if cfg.user_id is not None else user_for_device(device_id)


def make_schedule(cfg: SensorConfig, user_id: int) -> ClassSchedule:
    """The class schedule of ``cfg``; a rotating one starts at ``phase_offset`` (or user_id % K)."""
    if cfg.schedule == "all":
        return AllClasses(cfg.num_classes)
    offset = cfg.phase_offset if cfg.phase_offset is not None else user_id % cfg.num_classes
    return Rotating(cfg.classes_per_phase, cfg.phase_s, range(cfg.num_classes), offset)


def make_source(cfg: SensorConfig, device_id: str, transport=None, clock=None,
                topic: Optional[str] = None, fleet: Optional[str] = None) -> SensorSource:
    """The source for ``cfg.kind``.

    ``clock`` (a ``Clock``: ``now()`` and ``wait(seconds, stop_event)``, e.g. the simulator's)
    paces the source and, for synthetic and replay, a virtual clock is also the stream time (the
    schedule's clock); None = real time, with stream time counted from the window index. Kind "mqtt" needs ``transport`` and the topic (``topic``, or ``fleet`` for the
    device's own ``streamfl/v1/{fleet}/device/{device}/sensor``).
    """
    if clock is not None:
        clock = as_clock(clock)
    # Only a virtual clock is a meaningful shared timeline; real monotonic time starts at boot.
    time_fn = clock.now if clock is not None and type(clock) is not Clock else None
    if cfg.kind == "synthetic":
        from streamfl.sensors.synthetic import SyntheticSource

        user_id = user_id_for(cfg, device_id)
        return SyntheticSource(cfg, user_id, make_schedule(cfg, user_id), clock=clock,
                               time_fn=time_fn)
    if cfg.kind == "replay":
        from streamfl.sensors.replay import ReplaySource

        if not cfg.path:
            raise SensorError("sensor kind 'replay' needs a path to a dataset .npz")
        return ReplaySource(Path(cfg.path), cfg.windows_per_s, subject=cfg.subject, loop=cfg.loop,
                            shuffle=cfg.shuffle, seed=cfg.seed,
                            expected_shape=(cfg.window_len, cfg.channels),
                            num_classes=cfg.num_classes, clock=clock, time_fn=time_fn)
    if cfg.kind == "iio":
        from streamfl.sensors.iio import IioSource

        return IioSource(Path(cfg.iio_root), cfg.iio_device, cfg.sample_rate_hz, cfg.window_len,
                         cfg.stride, cfg.label_path, cfg.channels, clock=clock)
    if cfg.kind == "mqtt":
        from streamfl.sensors.mqtt_source import MqttSensorSource

        if transport is None:
            raise SensorError("sensor kind 'mqtt' needs the agent's MQTT transport")
        if topic is None:
            if fleet is None:
                raise SensorError("sensor kind 'mqtt' needs the fleet name (or an explicit topic)")
            from streamfl.protocol.topics import Topics

            topic = Topics(fleet).device(device_id, "sensor")
        return MqttSensorSource(transport, topic, cfg, clock=clock)
    raise SensorError("unknown sensor kind %r" % (cfg.kind,))
