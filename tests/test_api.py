"""pytest_dflash.api is the one surface suites import (httpx tests/test_exported_members.py style).

`__all__` is pinned: adding a name is a decision, removing one a breaking change, and both show up here. It
holds names (functions, classes, constants), never a module, so the list is the whole surface. The suites in
suites/ reach the plugin only through those names, and every name is one a suite uses: a layer can move its
internals without touching a suite, and the API cannot grow past what the checklist needs.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_dflash import api

SUITES = Path(__file__).parents[1] / "suites"
EXPORTED = [
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
# Names kept in the API that no suite in suites/ uses, each with the reason. Empty: every name is a suite's.
KEPT_UNUSED: dict[str, str] = {}


def test_all_is_pinned() -> None:
    assert api.__all__ == EXPORTED


def test_every_exported_name_exists() -> None:
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert not missing, f"pytest_dflash.api.__all__ names {missing}, which the module does not define"


def test_no_exported_name_is_a_module() -> None:
    modules = [name for name in api.__all__ if inspect.ismodule(getattr(api, name))]
    assert not modules, f"pytest_dflash.api exports whole modules {modules}: export the names the suites call"


def test_exported_functions_are_typed() -> None:
    """Every parameter and the return of an exported function is annotated (mypy strict checks the rest)."""
    untyped = []
    for name in api.__all__:
        obj = getattr(api, name)
        if not inspect.isfunction(obj):
            continue
        signature = inspect.signature(obj)
        untyped += [f"{name}({p.name})" for p in signature.parameters.values() if p.annotation is p.empty]
        untyped += [f"{name} -> ?"] if signature.return_annotation is signature.empty else []
    assert not untyped, f"exported functions with untyped parameters or return: {untyped}"


def test_the_api_module_defines_nothing_but_its_names() -> None:
    """No helper logic in api.py: it only re-exports (a function defined here would be a second home)."""
    tree = ast.parse(Path(api.__file__).read_text(encoding="utf-8"))
    statements = [type(node).__name__ for node in tree.body
                  if not isinstance(node, ast.ImportFrom | ast.Expr | ast.Assign)]
    assert not statements, f"api.py holds more than imports, its docstring and __all__: {statements}"


@dataclass
class SuiteUse:
    """What one suite file takes from the plugin: the api names it uses, and each way it reaches past them."""

    names: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of attributes over a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)):
        return f"{base}.{node.attr}"
    return None


def suite_use(path: Path) -> SuiteUse:
    """Parse `path`: the api names it uses and every reach past `api.__all__`, as 'line N: what'."""
    use = SuiteUse()
    found: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    api_aliases: set[str] = set()  # local dotted names bound to the module pytest_dflash.api
    imported: dict[str, str] = {}  # local name -> the api name it was imported as
    outside = "which is not in pytest_dflash.api.__all__"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "pytest_dflash.api":
                    api_aliases.add(alias.asname or alias.name)
                elif alias.name.split(".")[0] == "pytest_dflash":
                    found.append((node.lineno, f"imports {alias.name} (use pytest_dflash.api)"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "pytest_dflash":
                continue
            for alias in node.names:
                if node.module == "pytest_dflash" and alias.name == "api":
                    api_aliases.add(alias.asname or "api")
                elif node.module != "pytest_dflash.api":
                    module = node.module if node.module != "pytest_dflash" else f"pytest_dflash.{alias.name}"
                    found.append((node.lineno, f"imports {module} (use pytest_dflash.api)"))
                elif alias.name == "*":
                    found.append((node.lineno, "imports * from pytest_dflash.api (name each)"))
                elif alias.name not in api.__all__:
                    found.append((node.lineno, f"imports {alias.name}, {outside}"))
                else:
                    imported[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in imported:
            use.names.add(imported[node.id])
        if not isinstance(node, ast.Attribute) or not (dotted := _dotted(node.value)):
            continue
        if dotted in api_aliases and node.attr in api.__all__:  # api.NAME
            use.names.add(node.attr)
        elif dotted in api_aliases:
            found.append((node.lineno, f"uses pytest_dflash.api.{node.attr}, {outside}"))
        elif dotted in imported and inspect.ismodule(getattr(api, imported[dotted], None)):
            found.append((node.lineno, f"reaches through the module {dotted} to {node.attr}"))
    use.problems = [f"line {lineno}: {what}" for lineno, what in sorted(found)]  # ast.walk is breadth-first
    return use


SUITE_FILES = sorted(SUITES.rglob("*.py"))


@pytest.mark.parametrize("suite", SUITE_FILES, ids=lambda p: str(p.relative_to(SUITES)))
def test_suites_use_only_the_api_names(suite: Path) -> None:
    problems = suite_use(suite).problems
    assert not problems, f"{suite.relative_to(SUITES.parent)} reaches past pytest_dflash.api: {problems}"


def test_every_api_name_is_used_by_a_suite() -> None:
    used = set().union(*(suite_use(path).names for path in SUITE_FILES))
    unused = [name for name in api.__all__ if name not in used and name not in KEPT_UNUSED]
    assert not unused, (f"pytest_dflash.api exports {unused}, which no suite in suites/ uses: remove them, "
                        "or say in KEPT_UNUSED why they stay")
    stale = [name for name in KEPT_UNUSED if name in used or name not in api.__all__]
    assert not stale, f"KEPT_UNUSED names {stale}, which a suite uses or the API no longer exports"


def test_the_check_sees_every_reach_past_the_api(tmp_path: Path) -> None:
    suite = tmp_path / "test_x.py"
    suite.write_text(
        "import pytest_dflash.client\n"
        "from pytest_dflash import plugin\n"
        "from pytest_dflash.layers.gpu.checks import gpu_health\n"
        "from pytest_dflash.api import greedy, ServiceHandle as Handle\n"
        "from pytest_dflash.api import annotations\n"
        "from pytest_dflash.api import *\n"
        "import pytest_dflash.api as dflash\n"
        "from pytest_dflash import api\n"
        "import pytest_dflash.api\n"
        "def test_a(h: Handle) -> None:\n"
        "    greedy(h.client, native=True)\n"
        "    dflash.stays_up(h)\n"
        "    dflash.gpu_health(h)\n"
        "    api.ALL_CHAINS\n"
        "    pytest_dflash.api.checks.x\n")
    use = suite_use(suite)
    assert use.problems == [
        "line 1: imports pytest_dflash.client (use pytest_dflash.api)",
        "line 2: imports pytest_dflash.plugin (use pytest_dflash.api)",
        "line 3: imports pytest_dflash.layers.gpu.checks (use pytest_dflash.api)",
        "line 5: imports annotations, which is not in pytest_dflash.api.__all__",
        "line 6: imports * from pytest_dflash.api (name each)",
        "line 13: uses pytest_dflash.api.gpu_health, which is not in pytest_dflash.api.__all__",
        "line 15: uses pytest_dflash.api.checks, which is not in pytest_dflash.api.__all__",
    ], use.problems
    assert use.names == {"greedy", "ServiceHandle", "stays_up", "ALL_CHAINS"}


def test_the_check_sees_a_module_reached_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Were a module ever exported again, attribute access through it is reported (beside the pin failing)."""
    monkeypatch.setattr(api, "__all__", [*api.__all__, "inspect"])
    monkeypatch.setattr(api, "inspect", inspect, raising=False)
    suite = tmp_path / "test_x.py"
    suite.write_text("from pytest_dflash.api import inspect\n\n"
                     "def test_a() -> None:\n    inspect.isclass(1)\n")
    assert suite_use(suite).problems == ["line 4: reaches through the module inspect to isclass"]
