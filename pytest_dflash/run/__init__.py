"""Run state: hosts, services and what must be undone; collection, fixtures, layer blocking."""
