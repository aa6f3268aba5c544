"""Fleets: inventories, shards, the fleet summary, its HTML / JUnit / Prometheus outputs."""
