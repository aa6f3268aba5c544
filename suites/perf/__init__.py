"""The perf suite (`pytest_dflash.suites.perf` when installed)."""
