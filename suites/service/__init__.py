"""The service suite (`pytest_dflash.suites.service` when installed)."""
