"""The simulator's hooks for device scheduling: a simulated radio's SNR is what the device reports."""
from typing import Any, Dict


def device_settings(device: Any) -> Dict[str, Any]:
    """The agent plug-in's settings from a simulated device (``streamfl.sim.device.DeviceModel``):
    its uplink's ``P*|H|^2/N0`` (``snr_hz``) as ``channel_snr_hz``, which the scheduler plans the
    shared band with; nothing on a fixed-rate channel."""
    snr_hz = device.snr_hz
    return {} if snr_hz is None else {"channel_snr_hz": snr_hz}
