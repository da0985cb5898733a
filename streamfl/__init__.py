"""streamfl: on-device asynchronous federated learning over MQTT."""
__version__ = "0.1.0"
