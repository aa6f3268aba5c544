"""The public API: what the suites in suites/ (and users' own suites) import. Everything else is internal.

    from pytest_dflash.api import ServiceHandle, generation, parity

    @pytest.mark.generation
    def test_greedy_generation(dflash_service: ServiceHandle) -> None:
        \"\"\"A greedy request returns text, token counts and a finish reason.\"\"\"
        generation.greedy(dflash_service.client, native=dflash_service.native)

The fixtures (`dflash_host`, `dflash_service`, `dflash_service_raw`, `dflash_pair`, `dflash_gpu`,
`dflash_perf`, `dflash_layer_options`, `dflash_run_cache`) come with the plugin; the names below are what the
tests call. Pinned by tests/test_api.py: adding a name is a decision, removing one a breaking change.
"""

from __future__ import annotations

from pytest_dflash.errors import DflashError
from pytest_dflash.layers.generation import checks as generation
from pytest_dflash.layers.gpu import GpuHost, env, host, kernels
from pytest_dflash.layers.gpu.report import explain
from pytest_dflash.layers.parity import acceptance, distribution
from pytest_dflash.layers.parity import checks as parity_checks
from pytest_dflash.layers.parity import greedy as parity
from pytest_dflash.layers.parity.hooks import LayerOptions
from pytest_dflash.layers.perf.layer import PerfLayer
from pytest_dflash.layers.service import checks as service_checks
from pytest_dflash.layers.service import coldstart
from pytest_dflash.run.fixtures import ready_or_blocked
from pytest_dflash.run.state import HostContext, ServiceHandle

__all__ = [
    "DflashError",
    "GpuHost",
    "HostContext",
    "LayerOptions",
    "PerfLayer",
    "ServiceHandle",
    "acceptance",
    "coldstart",
    "distribution",
    "env",
    "explain",
    "generation",
    "host",
    "kernels",
    "parity",
    "parity_checks",
    "ready_or_blocked",
    "service_checks",
]
