"""The acceptance suites, one folder per layer plus smoke. From a clone: `pytest --host local suites/smoke`;
installed from the wheel, where this folder is the package `pytest_dflash.suites`:
`pytest --pyargs pytest_dflash.suites.smoke --host local`."""
