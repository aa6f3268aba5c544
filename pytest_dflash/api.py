"""The public API: the names the suites in suites/ (and users' own suites) call. Everything else is internal.

    import pytest

    from pytest_dflash.api import ServiceHandle, greedy

    @pytest.mark.generation
    def test_greedy_generation(dflash_service: ServiceHandle) -> None:
        \"\"\"A greedy request returns text, token counts and a finish reason.\"\"\"
        greedy(dflash_service.client, native=dflash_service.native)

Functions, classes and constants only, each re-exported by name from its one home; no modules, so a suite
cannot reach past this list. The fixtures (`dflash_host`, `dflash_service`, `dflash_service_raw`,
`dflash_pair`, `dflash_gpu`, `dflash_perf`, `dflash_layer_options`, `dflash_run_cache`) come with the plugin.
Pinned by tests/test_api.py: adding a name is a decision, removing one a breaking change, and every name is
one a suite calls.
"""

from __future__ import annotations

from pytest_dflash.layers.generation.chat_surface import (
    TOOL_CHOICES,
    forced_tool_call,
    reasoning_separated,
    reasoning_structured,
)
from pytest_dflash.layers.generation.checks import (
    SAMPLING_CASES,
    bad_parameters,
    concurrent_sampled,
    default_api,
    greedy,
    long_prompt_near_context,
    max_tokens_boundary,
    n_samples,
    sampled,
    sampled_case,
    sampling_varies_with_seed,
    still_serving,
    stop_string,
    stop_token_id,
    streamed,
    use_api,
)
from pytest_dflash.layers.generation.requests import APIS, Api
from pytest_dflash.layers.generation.structured import (
    STRUCTURED_CASES,
    serves_structured_output,
    structured_output,
)
from pytest_dflash.layers.gpu.chains import ALL_CHAINS
from pytest_dflash.layers.gpu.env import (
    driver_supports_torch_cuda,
    flashinfer_companions_match,
    flashinfer_toolkit_supports_gpu_arch,
    import_chain,
    installed_versions_satisfy_requirements,
    jit_link_finds_cuda_libraries,
    ninja_on_service_path,
    pip_check_clean_for_serving_stack,
    service_flags_exist_in_installed_sglang,
    service_python_is_the_profiles,
    serving_chains_import,
    serving_stack_matches_baseline,
    sgl_kernel_has_build_for_gpu_arch,
    toolkit_has_curand_headers,
    torch_arch_list_covers_gpus,
    torch_imports,
    torch_initialises_cuda,
)
from pytest_dflash.layers.gpu.host import (
    gpu_identity_reported,
    gpu_memory_healthy,
    gpus_visible,
    kernel_log_has_no_gpu_faults,
    kernel_log_has_no_oom_kills,
    nvidia_smi_lists_gpus,
    profile_gpus_present,
    service_gpus_not_held_by_other_processes,
)
from pytest_dflash.layers.gpu.kernels import (
    builds_cold,
    decode_attention_matches_sdpa,
    sampling_respects_top_k_top_p,
    service_does_not_rely_on_warm_jit_cache,
    triton_kernel_compiles_and_runs,
)
from pytest_dflash.layers.gpu.layer import GpuHost
from pytest_dflash.layers.gpu.parallel import service_gpus_match_parallelism
from pytest_dflash.layers.parity.checks import (
    accept_length,
    ddtree_accepts_at_least_dflash,
    distribution_parity,
    greedy_parity,
    quick_accept_length,
)
from pytest_dflash.layers.parity.greedy import SMOKE_PROMPTS, check_slice
from pytest_dflash.layers.parity.hooks import LayerOptions
from pytest_dflash.layers.parity.structured import structured_parity
from pytest_dflash.layers.perf.layer import PerfLayer
from pytest_dflash.layers.service.checks import (
    has_not_restarted,
    health_answers,
    ready_by_real_generation,
    serves_one_consistent_model,
    serves_the_commands_configuration,
    serves_the_profiles_algorithm,
    serves_the_profiles_speculation,
    stays_up,
)
from pytest_dflash.layers.service.coldstart import cold_start_within_budgets
from pytest_dflash.run.handle import ServiceHandle
from pytest_dflash.run.skips import needs_sglang, not_applicable
from pytest_dflash.run.state import HostContext

__all__ = [
    "ALL_CHAINS",
    "APIS",
    "SAMPLING_CASES",
    "SMOKE_PROMPTS",
    "STRUCTURED_CASES",
    "TOOL_CHOICES",
    "Api",
    "GpuHost",
    "HostContext",
    "LayerOptions",
    "PerfLayer",
    "ServiceHandle",
    "accept_length",
    "bad_parameters",
    "builds_cold",
    "check_slice",
    "cold_start_within_budgets",
    "concurrent_sampled",
    "ddtree_accepts_at_least_dflash",
    "decode_attention_matches_sdpa",
    "default_api",
    "distribution_parity",
    "driver_supports_torch_cuda",
    "flashinfer_companions_match",
    "flashinfer_toolkit_supports_gpu_arch",
    "forced_tool_call",
    "gpu_identity_reported",
    "gpu_memory_healthy",
    "gpus_visible",
    "greedy",
    "greedy_parity",
    "has_not_restarted",
    "health_answers",
    "import_chain",
    "installed_versions_satisfy_requirements",
    "jit_link_finds_cuda_libraries",
    "kernel_log_has_no_gpu_faults",
    "kernel_log_has_no_oom_kills",
    "long_prompt_near_context",
    "max_tokens_boundary",
    "n_samples",
    "needs_sglang",
    "ninja_on_service_path",
    "not_applicable",
    "nvidia_smi_lists_gpus",
    "pip_check_clean_for_serving_stack",
    "profile_gpus_present",
    "quick_accept_length",
    "ready_by_real_generation",
    "reasoning_separated",
    "reasoning_structured",
    "sampled",
    "sampled_case",
    "sampling_respects_top_k_top_p",
    "sampling_varies_with_seed",
    "serves_one_consistent_model",
    "serves_structured_output",
    "serves_the_commands_configuration",
    "serves_the_profiles_algorithm",
    "serves_the_profiles_speculation",
    "service_does_not_rely_on_warm_jit_cache",
    "service_flags_exist_in_installed_sglang",
    "service_gpus_match_parallelism",
    "service_gpus_not_held_by_other_processes",
    "service_python_is_the_profiles",
    "serving_chains_import",
    "serving_stack_matches_baseline",
    "sgl_kernel_has_build_for_gpu_arch",
    "stays_up",
    "still_serving",
    "stop_string",
    "stop_token_id",
    "streamed",
    "structured_output",
    "structured_parity",
    "toolkit_has_curand_headers",
    "torch_arch_list_covers_gpus",
    "torch_imports",
    "torch_initialises_cuda",
    "triton_kernel_compiles_and_runs",
    "use_api",
]
