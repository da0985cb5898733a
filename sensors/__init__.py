"""Sensor sources (synthetic, replay, Linux IIO, MQTT topic), windowing, wire encodings, datasets."""
from streamfl.sensors.base import Clock, FunctionClock, ManualClock, SensorSource, as_clock
from streamfl.sensors.config import SensorConfig
from streamfl.sensors.datasets import Dataset, load_npz, save_npz, watch_to_npz
from streamfl.sensors.encoding import decode_window, encode_window_binary, encode_window_json
from streamfl.sensors.factory import make_schedule, make_source
from streamfl.sensors.iio import IioSource
from streamfl.sensors.mqtt_source import MqttSensorSource
from streamfl.sensors.replay import ReplaySource
from streamfl.sensors.schedule import AllClasses, ClassSchedule, Rotating, Sequence
from streamfl.sensors.synthetic import SyntheticSource, synthetic_dataset
from streamfl.sensors.window import UNLABELLED, Window
from streamfl.sensors.windower import Windower, majority_label

__all__ = [
    "Clock", "FunctionClock", "ManualClock", "SensorSource", "as_clock", "SensorConfig", "Dataset",
    "load_npz", "save_npz", "watch_to_npz", "decode_window", "encode_window_binary",
    "encode_window_json", "make_schedule", "make_source", "IioSource", "MqttSensorSource",
    "ReplaySource", "AllClasses", "ClassSchedule", "Rotating", "Sequence", "SyntheticSource",
    "synthetic_dataset", "UNLABELLED", "Window", "Windower", "majority_label",
]
