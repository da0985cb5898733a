"""Board profiles (one YAML per board), installed so an agent can find its own."""
