"""The host suite (`pytest_dflash.suites.host` when installed)."""
