"""`pytest-dflash --version`, `check` (the plugin's own validation and one-line errors, exit 4) and `schema`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from pytest_dflash import __version__
from pytest_dflash.cli import main
from pytest_dflash.config.schema import profile_schema

ROOT = Path(__file__).parents[1]
SCRIPT = Path(sys.executable).parent / "pytest-dflash"
BASE = """
[host]
connection = "ssh://root@placeholder?timeout=3"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
url = "http://{address}:30001"
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "pytest_dflash.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


def test_version() -> None:
    done = _cli("--version")
    assert (done.returncode, done.stdout) == (0, f"pytest-dflash {__version__}\n")


def test_schema_prints_the_profile_schema() -> None:
    done = _cli("schema")
    assert done.returncode == 0 and json.loads(done.stdout) == profile_schema()
    jsonschema.Draft202012Validator.check_schema(json.loads(done.stdout))


def test_check_prints_what_each_host_resolves_to(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["check", "ct200", "local", "http://10.1.2.9:30000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("ct200: ssh://root@10.1.2.200?timeout=4 (provision allowed; python "
                      f"/root/venv_sglang211/bin/python; gpus 0,1) <- {ROOT}/hosts/ct200.toml")
    assert "  dflash: systemd DFLASH http://10.1.2.200:30001, unit sglang-dflash-smoke.service, gpus 1" in out
    assert "  parity: dflash vs ddtree" in out
    assert any(line.startswith("  perf: endpoint=generate, concurrency=8, requests=400, duration=15m00s") for line in out)
    assert ("  floors.ddtree: output_tok_s=40, ttft_p99_ms=2000, itl_p99_ms=250, accept_length=2.5, "
            "speedup_vs=dflash, speedup=1, regression_pct=10") in out
    assert any(line.startswith("local: local:// (provision always;") for line in out)
    assert "  dflash: process DFLASH http://127.0.0.1:{port}" in out
    assert "10.1.2.9:30000: no host access (attached by URL) (provision never; python python3) <- --attach" in out
    assert "  attached: external AUTO http://10.1.2.9:30000" in out
    # a URL is validated as written: check says it did not contact it (issue 32)
    assert out[out.index("  attached: external AUTO http://10.1.2.9:30000") + 1].startswith(
        "  not contacted: check reads the URL, it sends nothing to it;")
    assert out[-1] == "3 host(s) valid (1 URL(s) checked as written, not contacted)"


def test_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gpu-base.toml").write_text(BASE)
    (tmp_path / "fleet.yml").write_text("all:\n  vars: {dflash_profile: gpu-base.toml}\n  hosts:\n"
                                        "    g1: {ansible_host: 10.0.0.1}\n    g2: {ansible_host: 10.0.0.2}\n")
    assert main(["check", "--json", f"{tmp_path / 'fleet.yml'}:all"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == [] and sorted(report["hosts"]) == ["g1", "g2"]
    assert report["hosts"]["g2"]["connection"] == "ssh://10.0.0.2?timeout=3"
    assert report["hosts"]["g2"]["services"]["dflash"] == {
        "kind": "systemd", "algorithm": "DFLASH", "url": "http://10.0.0.2:30001", "unit": "sglang-dflash.service",
        "ready_timeout": "15m00s"}
    assert report["hosts"]["g2"]["provision"] == "allowed" and report["hosts"]["g2"]["parity"] is None
    assert report["not_contacted"] == []
    # an inventory host names the inventory and the host, not a file "gpu-base@g2.toml" that does not exist
    assert report["hosts"]["g2"]["source"] == f"{tmp_path}/gpu-base.toml (host g2 of inventory fleet.yml)"


def _plugin_error(pytester: pytest.Pytester, *args: str) -> str:
    """The one-line usage error pytest itself prints for these options."""
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == 4, result.stdout.str()
    (line,) = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    return line.removeprefix("ERROR: ")


@pytest.mark.parametrize(
    ("files", "kind", "target"),
    [
        ({"bad.toml": BASE.replace('algorithm = "DFLASH"', 'algorithm = "FLASH"')}, "--host", "bad.toml"),
        ({"hosts/bad.toml": BASE + "\n[extra]\nx = 1\n"}, "--host", "bad"),
        ({}, "--host", "no-such-host"),
        ({"gpu-base.toml": BASE, "f.yml": "all:\n  hosts:\n    x: {ansible_host: 1.2.3.4}\n"}, "--fleet", "f.yml"),
        ({"gpu-base.toml": BASE, "f.yml": "g:\n  hosts:\n    x: {dflash_profile: gpu-base.toml}\n"},
         "--fleet", "f.yml:cpus"),
        ({"fleet/a.toml": BASE.replace("ssh://", "ftp://")}, "--fleet", "fleet"),
        # nested past what the parser follows: no RecursionError (an INTERNALERROR, a bare traceback)
        ({"deep.toml": "a = " + "[" * 500 + "]" * 500 + "\n"}, "--host", "deep.toml"),
        ({"deep.toml": "[" + ".".join(["a"] * 5000) + "]\n"}, "--host", "deep.toml"),
    ],
)
def test_check_gives_the_plugins_one_line_error_and_exit_4(pytester: pytest.Pytester, files: dict[str, str],
                                                            kind: str, target: str) -> None:
    for name, text in files.items():
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / name).write_text(text)
    expected = _plugin_error(pytester, kind, target)
    done = subprocess.run([*([str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "pytest_dflash.cli"]),
                           "check", target], capture_output=True, text=True, timeout=60, cwd=pytester.path,
                          check=False)
    assert done.returncode == 4
    assert done.stderr == f"pytest-dflash check: error: {expected}\n"
    assert "Traceback" not in done.stdout + done.stderr


def test_check_reports_every_bad_input_and_the_good_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    (tmp_path / "a.toml").write_text(BASE.replace("[host]", "[host]\nconection = 1"))
    (tmp_path / "b.toml").write_text(BASE.replace("30001", "x"))
    assert main(["check", "ct200", str(tmp_path / "a.toml"), str(tmp_path / "b.toml"), "hosts"]) == 4
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"pytest-dflash check: error: {tmp_path}/a.toml: host.conection: unknown key (did you mean 'connection'?)",
        f"pytest-dflash check: error: {tmp_path}/b.toml: services.dflash.url: expected an http(s) URL with a "
        "numeric port, got 'http://{address}:x'",
        "pytest-dflash check: error: hosts: ct200: this host name is already used by another profile",
    ]
    assert captured.out.splitlines()[-1] == "1 host(s) valid, 3 error(s)"


def test_the_console_script_is_installed() -> None:
    assert SCRIPT.exists() or shutil.which("pytest-dflash"), "pip install -e . installs the pytest-dflash script"


def test_check_masks_url_passwords_in_text_and_json(tmp_path: Path) -> None:
    """`check` prints the connection and every service URL: never with its password (text and --json)."""
    password = "Tr0ub4dor-and-3"
    (tmp_path / "gpu7.toml").write_text(BASE.replace("root@placeholder", f"root:{password}@10.0.0.7")
                                        + f'\n[services.api]\nkind = "external"\nurl = "https://svc:{password}'
                                          '@api.example.com:8443"\n')
    attach = f"http://user:{password}@10.0.0.8:30000"
    text = _cli("check", str(tmp_path / "gpu7.toml"), attach)
    assert text.returncode == 0, text.stderr
    assert password not in text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("gpu7: ssh://root:***REDACTED***@10.0.0.7?timeout=3 (provision allowed;")
    assert "  api: external AUTO https://svc:***REDACTED***@api.example.com:8443" in lines
    assert "  attached: external AUTO http://user:***REDACTED***@10.0.0.8:30000" in lines
    done = _cli("check", "--json", str(tmp_path / "gpu7.toml"), attach)
    assert done.returncode == 0 and password not in done.stdout + done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert hosts["gpu7"]["connection"] == "ssh://root:***REDACTED***@10.0.0.7?timeout=3"
    assert hosts["gpu7"]["services"]["api"]["url"] == "https://svc:***REDACTED***@api.example.com:8443"
    assert hosts["10.0.0.8:30000"]["services"]["attached"]["url"] == "http://user:***REDACTED***@10.0.0.8:30000"


def test_check_json_reports_bad_input_as_one_line_errors(tmp_path: Path) -> None:
    """--json: each error is the plugin's one line (escaped control characters, masked passwords), exit 4."""
    (tmp_path / "bad.toml").write_bytes(b"[host]\nconnection = \"local://\"\nname = \"caf\xe9\"\n")
    done = _cli("check", "--json", str(tmp_path / "bad.toml"), "http://u:Tr0ub4dor-and-3@[::1:9")
    assert done.returncode == 4 and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["errors"] == [
        f"{tmp_path}/bad.toml: expected UTF-8 text, got byte 0xe9 at line 3 (offset 42): save the file as UTF-8",
        "--attach: url: expected an http(s) URL, got 'http://u:***REDACTED***@[::1:9' (malformed host: Invalid IPv6 "
        "URL; an IPv6 address is written in brackets, e.g. [fd00::1])"]
