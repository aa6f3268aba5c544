"""The generation suite (`pytest_dflash.suites.generation` when installed)."""
