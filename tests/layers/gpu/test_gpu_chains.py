"""Which import chains a service needs, from its command line or its unit file (read by services/systemd.py)."""

from __future__ import annotations

from gpu_data import REPO

from pytest_dflash.layers.gpu.chains import (
    ALL_CHAINS,
    GRAMMAR_BACKENDS,
    chains_for,
    entrypoint,
    grammar_backends,
)
from pytest_dflash.services.systemd import parse_environment, parse_exec_start, parse_unit


def test_entrypoints() -> None:
    assert entrypoint(["/venv/bin/python", "-m", "sglang.launch_server", "--port", "1"]) == "sglang.launch_server"
    assert entrypoint(["python3", "-msglang.launch_server"]) == "sglang.launch_server"
    assert entrypoint(["/venv/bin/sglang", "serve", "--model-path", "m"]) == "sglang.cli"
    assert entrypoint(["{python}", "-m", "pytest_dflash.refserver"]) == "pytest_dflash.refserver"
    assert entrypoint(["/usr/bin/vllm", "serve"]) is None


def test_sglang_services_need_the_four_serving_chains_and_their_grammar_backend_once() -> None:
    chains = chains_for([["python", "-m", "sglang.launch_server"], ["sglang", "serve"]])
    assert [c.name for c in chains] == ["http_server", "grammar", "sgl_kernel", "flashinfer"]
    grammar = chains[1]
    assert grammar.modules[0] == "sglang.srt.server_args"  # StructuralTag is imported before args are parsed
    assert grammar.modules[-1] == "sglang.srt.constrained.xgrammar_backend"  # the default backend: xgrammar
    assert [c.name for c in chains_for([["python", "-m", "pytest_dflash.refserver"]])] == [
        "refserver_args", "refserver_http", "refserver_grammar"]
    assert set(ALL_CHAINS) == {"http_server", "grammar", "sgl_kernel", "flashinfer", "refserver_args",
                               "refserver_http", "grammar_outlines", "grammar_llguidance", "refserver_grammar"}


def test_the_grammar_backend_the_command_asks_for_is_imported_and_none_imports_nothing() -> None:
    def grammar_chains(*flags: str) -> list[tuple[str, ...]]:
        chains = chains_for([["python", "-m", "sglang.launch_server", *flags]])
        return [c.modules for c in chains if c.name.startswith("grammar_")]

    assert grammar_chains("--grammar-backend", "llguidance") == [
        ("llguidance", "sglang.srt.constrained.llguidance_backend")]
    assert grammar_chains("--grammar-backend=outlines") == [("outlines", "sglang.srt.constrained.outlines_backend")]
    assert grammar_chains("--grammar-backend", "none") == grammar_chains("--grammar-backend", "xgrammar") == []


def test_the_projects_unit_template() -> None:
    keys = parse_unit((REPO / "hosts" / "units" / "sglang-dflash.service").read_text())
    env = parse_environment(keys["Environment"])
    assert env["CUDA_HOME"] == "/usr/local/cuda" and env["CUDA_VISIBLE_DEVICES"] == "{gpus}"
    argv = parse_exec_start(keys["ExecStart"][0])
    assert argv[:3] == ["{python}", "-m", "sglang.launch_server"] and "--attention-backend" in argv


def test_exec_start_as_systemctl_show_prints_it() -> None:
    shown = ("{ path=/root/venv_sglang211/bin/python ; argv[]=/root/venv_sglang211/bin/python -m "
             "sglang.launch_server --port 30001 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; "
             "pid=0 ; code=(null) ; status=0/0 }")
    assert parse_exec_start(shown) == ["/root/venv_sglang211/bin/python", "-m", "sglang.launch_server", "--port",
                                       "30001"]
    assert parse_exec_start("-/usr/bin/env python3 -m x") == ["/usr/bin/env", "python3", "-m", "x"]


def test_environment_quoting() -> None:
    assert parse_environment(['A=1 "B=two words"', "C=x=y"]) == {"A": "1", "B": "two words", "C": "x=y"}


def test_the_backend_each_sglang_command_asks_for_and_the_chain_that_imports_it() -> None:
    commands = [["python", "-m", "sglang.launch_server"], ["sglang", "serve", "--grammar-backend", "outlines"],
                ["python", "-m", "sglang.launch_server", "--grammar-backend=xgrammar"],
                ["python", "-m", "pytest_dflash.refserver", "--grammar-backend", "llguidance"]]
    assert [(flag, b.name) for flag, b in grammar_backends(commands, "grammar")] == [
        ("no --grammar-backend (SGLang's default: xgrammar)", "xgrammar"), ("--grammar-backend xgrammar", "xgrammar")]
    assert grammar_backends(commands, "grammar_outlines") == [("--grammar-backend outlines", GRAMMAR_BACKENDS["outlines"])]
    assert grammar_backends(commands, "grammar_llguidance") == []  # the refserver serves every backend with xgrammar
    assert grammar_backends([["python", "-m", "sglang.launch_server", "--grammar-backend", "none"]], "grammar") == []
    assert {b.chain for b in GRAMMAR_BACKENDS.values()} <= set(ALL_CHAINS)
