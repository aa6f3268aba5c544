"""Host profiles: valid ones load; every malformed one is a one-line error naming file, key and expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_dflash.config.loader import attach_profile, load_profile, resolve_profile_path
from pytest_dflash.config.placeholders import render
from pytest_dflash.errors import InventoryError

ROOT = Path(__file__).parents[2]
GOOD = """
[host]
connection = "ssh://root@10.1.2.200"
python = "/root/venv/bin/python"

[services.dflash]
unit = "sglang-dflash.service"
algorithm = "DFLASH"
port = 30001
"""


def write(tmp_path: Path, text: str, name: str = "h.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_profiles_load() -> None:
    local = load_profile(ROOT / "hosts" / "local.toml")
    assert local.is_local and local.provision == "always"
    assert {s.algorithm for s in local.services.values()} == {"NONE", "DFLASH", "DDTREE"}
    ct200 = load_profile(ROOT / "hosts" / "ct200.toml")
    assert ct200.services["dflash"].gpus == (1,) and ct200.services["dflash"].port == 30001
    assert ct200.services["ddtree"].gpus == (0,) and ct200.services["ddtree"].port == 30000
    assert ct200.python == "/root/venv_sglang211/bin/python"


def test_defaults_fill_in_url_kind_and_connect_timeout(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path, GOOD))
    service = profile.services["dflash"]
    assert service.kind == "systemd"
    assert service.url == "http://10.1.2.200:30001"
    assert profile.connection == "ssh://root@10.1.2.200?timeout=4"
    assert profile.name == "h"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('python = "/root/venv/bin/python"', 'python = 3'),
         "host.python: expected a string, got integer 3"),
        (lambda t: t + "\n[extra]\nx = 1\n", "extra: unknown key"),
        (lambda t: t.replace("[host]", "[host]\nconection = 'x'"), "host.conection: unknown key (did you mean 'connection'?)"),
        (lambda t: t.replace('algorithm = "DFLASH"', 'algorithm = "FLASH"'), "services.dflash.algorithm: expected one of"),
        (lambda t: t.replace('port = 30001', 'url = "htp:/x"'), "services.dflash.url: expected an http(s) URL, got 'htp:/x'"),
        (lambda t: t.replace('unit = "sglang-dflash.service"\n', ""), "services.dflash.unit: missing required key"),
        (lambda t: t.replace('connection = "ssh://root@10.1.2.200"', 'connection = "ftp://x"'),
         "host.connection: expected local:// or ssh://"),
        (lambda t: t.replace('connection = "ssh://root@10.1.2.200"', 'connection = "ssh://h?timeout=30"'),
         "host.connection: connect timeout must be in (0, 5]"),
        (lambda t: t.replace("port = 30001", 'port = "x"'), 'services.dflash.port: expected a TCP port number or "auto"'),
        (lambda t: t + '\n[services.dflash.env]\nA = ["x"]\n', "services.dflash.env.A: expected a string or number"),
        (lambda t: t.replace("port = 30001", "port = 30001\nready_timeout = \"soon\""),
         "services.dflash.ready_timeout: expected a duration"),
        (lambda t: t + '\n[parity]\nreference = "nope"\n', "parity.reference: expected a service of this host"),
        (lambda t: t + '\n[floors.dflash]\noutput_toks = 3\n', "floors.dflash.output_toks: unknown floor"),
        (lambda t: t.replace("[host]", "[hosts]"), "host: missing required key"),
        (lambda t: t + "\nbroken = [", "not valid TOML"),
    ],
)
def test_malformed_profile_is_one_line_naming_file_and_key(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(InventoryError) as info:
        load_profile(path)
    text = str(info.value)
    assert text.startswith(str(path)), text
    assert message in text, text
    assert "\n" not in text


def test_process_services_run_on_this_machine_only(tmp_path: Path) -> None:
    text = GOOD.replace('unit = "sglang-dflash.service"', 'kind = "process"\ncommand = ["x"]')
    with pytest.raises(InventoryError, match='kind = "process" runs on this machine'):
        load_profile(write(tmp_path, text))


def test_missing_template_file_is_reported(tmp_path: Path) -> None:
    text = GOOD.replace("port = 30001", 'port = 30001\ntemplate = "units/none.service"')
    with pytest.raises(InventoryError, match="services.dflash.template: expected a unit template file"):
        load_profile(write(tmp_path, text))


def test_resolve_by_name_path_and_builtin(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "gpu7.toml")
    assert resolve_profile_path("gpu7", [tmp_path]) == path
    assert resolve_profile_path(str(path), []) == path
    assert resolve_profile_path("local", [tmp_path]).name == "local.toml"  # built-in fallback
    with pytest.raises(InventoryError, match="no host profile named 'nope'.*known: .*gpu7"):
        resolve_profile_path("nope", [tmp_path])


def test_attach_profile_validates_url() -> None:
    profile = attach_profile("http://127.0.0.1:30000/")
    assert profile.connection is None and profile.services["attached"].url == "http://127.0.0.1:30000"
    with pytest.raises(InventoryError, match="--attach: url: expected an http"):
        attach_profile("127.0.0.1:30000")


def test_render_keeps_systemd_variables_and_rejects_unknown_names() -> None:
    assert render("ExecStart={python} ${HOME}", {"python": "/p"}, where="t") == "ExecStart=/p ${HOME}"
    with pytest.raises(ValueError, match=r"unknown placeholder \{gpu\}"):
        render("{gpu}", {}, where="t")


def test_structured_output_defaults_to_served_and_takes_a_bool(tmp_path: Path) -> None:
    """structured_output: true unless the profile says false; anything but a bool is a one-line error."""
    assert load_profile(write(tmp_path, GOOD)).services["dflash"].structured_output is True
    off = load_profile(write(tmp_path, GOOD + "structured_output = false\n"))
    assert off.services["dflash"].structured_output is False
    with pytest.raises(InventoryError, match="services.dflash.structured_output: expected"):
        load_profile(write(tmp_path, GOOD + 'structured_output = "no"\n'))
