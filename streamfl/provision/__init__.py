"""``streamfl provision``: a fleet file in, every credential, broker file, coordinator config and
board kit of a TLS fleet out, so thirty boards are thirty copied folders, not thirty hand edits.

One concern per module: ``fleet_file`` (the fleet file, validated), ``pki`` (the CA and the
certificates), ``passwords`` (mosquitto's password hashes), ``broker_files`` (the shipped mosquitto
config and ACL, rewritten), ``coordinator_files`` (the coordinator's and the operator's YAML,
keys and accounts), ``kits`` (one folder per board), ``registry`` (what was issued and revoked),
``ownership`` (file modes and the ``mosquitto`` user), ``provisioner`` (the run that ties them
together), ``report`` (the output's README and what is printed) and ``cli`` (the sub-command).
"""
