"""Service managers (systemd units, local processes, external URLs) and readiness."""
