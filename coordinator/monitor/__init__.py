"""The coordinator's live fleet view: a read-only HTTP server (dashboard, JSON API, Prometheus).

``config.py`` holds its settings (the ``monitor:`` section), ``http.py`` the server, ``prometheus.py``
the ``/metrics`` collector and ``static/`` the dashboard page. The data comes from the coordinator
as two callables (a snapshot and a series), so nothing here touches the core. Import the pieces
from their modules: this file stays light, as the coordinator's package file does.
"""
