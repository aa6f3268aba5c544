"""The env suite (`pytest_dflash.suites.env` when installed)."""
