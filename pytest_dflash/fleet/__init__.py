"""Fleets: the fleet summary and its trend, its HTML / JUnit / Prometheus outputs, hosts over xdist
workers."""
