"""The repository's own defaults for running suites/ from a clone.

    pytest --host local suites/smoke                    # installed: the pytest11 entry point loads the plugin
    PYTHONPATH=. pytest --host local suites/smoke       # not installed (e.g. a GPU box with a bare python)

Without an installed distribution the entry point is missing, so the plugin is loaded from the checkout.
"""

from __future__ import annotations

from importlib.metadata import entry_points

_installed = any(ep.value == "pytest_dflash.plugin" for ep in entry_points(group="pytest11"))
pytest_plugins: list[str] = [] if _installed else ["pytest_dflash.plugin"]
