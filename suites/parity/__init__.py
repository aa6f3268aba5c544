"""The parity suite (`pytest_dflash.suites.parity` when installed)."""
