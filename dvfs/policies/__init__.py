"""DVFS policies: which clock level each domain runs the next training round at."""
