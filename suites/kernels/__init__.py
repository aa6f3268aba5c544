"""The kernels suite (`pytest_dflash.suites.kernels` when installed)."""
