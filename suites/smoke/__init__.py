"""The smoke suite (`pytest_dflash.suites.smoke` when installed)."""
