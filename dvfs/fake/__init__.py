"""Fake sysfs trees per board (``tree``, written by ``files`` and ``ina3221``) and a kernel that
applies sysfs write rules to them (tests, demos)."""
