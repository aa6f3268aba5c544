"""Bad input is one line naming the file (or option), the key and what was expected, never a traceback: profiles
that are not UTF-8, malformed IPv6 hosts, host names that cannot name a host, durations that are not finite or
longer than 7 days; the same from --fleet inventories (built-in parser and real ansible-inventory). And the
display forms: a password in a connection or URL never reaches a printed line."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pytest_dflash.config.durations import MAX_SECONDS, DurationError, parse_seconds
from pytest_dflash.config.inventory import ANSIBLE_ENV, load_fleet
from pytest_dflash.config.loader import attach_profile, error_line, load_profile
from pytest_dflash.errors import InventoryError
from pytest_dflash.scrub.redact import MASK

EXTERNAL = """
[host]
connection = "local://"

[services.a]
kind = "external"
algorithm = "DFLASH"
url = "http://127.0.0.1:30000"
"""
SSH = """
[host]
connection = "ssh://root@10.0.0.1"

[services.a]
unit = "a.service"
algorithm = "DFLASH"
port = 30001
"""
BESIDE_PYTHON = Path(sys.executable).parent / "ansible-inventory"
ANSIBLE = shutil.which("ansible-inventory") or (str(BESIDE_PYTHON) if BESIDE_PYTHON.exists() else None)


def _error(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_profile(path)
    line = error_line(info.value)
    assert "\n" not in line and line.startswith(f"{path}: "), line
    return line.removeprefix(f"{path}: ")


def test_a_profile_that_is_not_utf8_names_the_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(EXTERNAL.replace("[host]", '[host]\nname = "caf\xe9"').encode("latin-1"))
    assert _error(path) == "expected UTF-8 text, got byte 0xe9 at line 3 (offset 19): save the file as UTF-8"


@pytest.mark.parametrize(("old", "new", "key"), [
    ('connection = "ssh://root@10.0.0.1"', 'connection = "ssh://root@[fd00::1:22"', "host.connection"),
    ('connection = "ssh://root@10.0.0.1"', 'connection = "ssh://root@10.0.0.1]:22"', "host.connection"),
    ('connection = "ssh://root@10.0.0.1"', 'connection = "ssh://[not-an-address]:22"', "host.connection"),
    ("port = 30001", 'url = "http://[::1:30001"', "services.a.url"),
    ("port = 30001", 'url = "http://[zz]:30001"', "services.a.url"),
])
def test_a_malformed_ipv6_host_is_one_line(tmp_path: Path, old: str, new: str, key: str) -> None:
    path = tmp_path / "h.toml"
    path.write_text(SSH.replace(old, new))
    message = _error(path)
    assert message.startswith(f"{key}: expected "), message
    assert "malformed host" in message and "brackets" in message


def test_a_malformed_attach_url_is_one_line_with_its_password_masked() -> None:
    with pytest.raises(InventoryError) as info:
        attach_profile("http://user:hunter2hunter2@[::1:30000")
    line = error_line(info.value)
    assert line.startswith("--attach: url: expected an http(s) URL, got 'http://user:" + MASK + "@[::1:30000'")
    assert "hunter2" not in line


def test_an_ipv6_host_that_is_well_formed_gets_bracketed_service_urls(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text(SSH.replace("root@10.0.0.1", "root@[fd00::1]:2222")
                    + '\n[services.b]\nunit = "b.service"\nalgorithm = "NONE"\nurl = "http://{address}:30002"\n')
    profile = load_profile(path)
    assert profile.address == "fd00::1"
    assert profile.services["a"].url == "http://[fd00::1]:30001"
    assert profile.services["b"].url == "http://[fd00::1]:30002"
    assert attach_profile("http://[fd00::1]:30000").name == "fd00::1:30000"


@pytest.mark.parametrize(("name", "expected"), [
    ("a/b", "expected a host name without '/'"),
    ("a\\\\b", "expected a host name without '/' or '\\'"),
    ("", "expected a host name that is not empty, got ''"),
    ("   ", "expected a host name that is not empty, got '   '"),
    ("gpu\\n01", "expected a host name without control or invisible characters, got 'gpu\\n01'"),
    ("gpu\\u0000", "expected a host name without control or invisible characters, got 'gpu\\x00'"),
    ("gpu\\u202e10", "expected a host name without control or invisible characters, got 'gpu\\u202e10'"),
    (" gpu", "expected a host name without leading or trailing spaces, got ' gpu'"),
])
def test_a_host_name_that_cannot_name_a_host_is_refused(tmp_path: Path, name: str, expected: str) -> None:
    path = tmp_path / "h.toml"
    path.write_text(EXTERNAL.replace("[host]", f'[host]\nname = "{name}"'))
    message = _error(path)
    assert message.startswith(f"host.name: {expected}"), message


def test_a_file_name_that_cannot_name_a_host_says_to_set_name(tmp_path: Path) -> None:
    path = tmp_path / "gpu\x0701.toml"
    path.write_text(EXTERNAL)
    with pytest.raises(InventoryError) as info:
        load_profile(path)
    assert error_line(info.value) == (
        f"{tmp_path}/gpu\\x0701.toml: host.name: expected a host name without control or invisible characters, got "
        "'gpu\\x0701' (the default: the file's or inventory host's name; set [host] name)")


def test_good_host_names_still_load(tmp_path: Path) -> None:
    for name in ("gpu-01.example.com", "h200_7", "10.0.0.1", "fd00::1", "gpu 7", "ŝerver"):
        path = tmp_path / "h.toml"
        path.write_text(EXTERNAL.replace("[host]", f'[host]\nname = "{name}"'))
        assert load_profile(path).name == name


@pytest.mark.parametrize(("value", "expected"), [
    ("1e308", "expected a duration of at most 7 days (604800s, 168h), got 1e+308"),
    ('"99999999999999999999h"', "expected a duration of at most 7 days (604800s, 168h), got '99999999999999999999h'"),
    ("99999999999999999999", "expected a duration of at most 7 days (604800s, 168h), got 99999999999999999999"),
    ('"169h"', "expected a duration of at most 7 days (604800s, 168h), got '169h'"),
    ("604801", "expected a duration of at most 7 days (604800s, 168h), got 604801"),
    ("nan", "expected a duration like 90, '90s' or '15m', got nan"),
    ("inf", "expected a duration like 90, '90s' or '15m', got inf"),
    ("-inf", "expected a duration like 90, '90s' or '15m', got -inf"),
])
def test_a_duration_that_is_not_finite_or_longer_than_7_days_is_refused(tmp_path: Path, value: str,
                                                                         expected: str) -> None:
    path = tmp_path / "h.toml"
    path.write_text(EXTERNAL + f"ready_timeout = {value}\n")
    assert _error(path) == f"services.a.ready_timeout: {expected}"


@pytest.mark.parametrize(("value", "seconds"), [("604800", 604800.0), ('"168h"', 604800.0), ('"10080m"', 604800.0),
                                               ("604799.5", 604799.5)])
def test_seven_days_is_the_longest_duration(tmp_path: Path, value: str, seconds: float) -> None:
    path = tmp_path / "h.toml"
    path.write_text(EXTERNAL + f"ready_timeout = {value}\n")
    assert load_profile(path).services["a"].ready_timeout_s == seconds


@pytest.mark.parametrize("table", ["[parity]\nreference = \"a\"\ntie_gap = nan\n",
                                   "[parity]\nreference = \"a\"\nnoise_gap = inf\n",
                                   "[perf]\ntemperature = nan\n", "[perf]\nmax_client_cpu = inf\n",
                                   "[floors.a]\noutput_tok_s = inf\n"])
def test_a_number_that_is_not_finite_is_refused(tmp_path: Path, table: str) -> None:
    path = tmp_path / "h.toml"
    path.write_text(EXTERNAL + "\n" + table)
    message = _error(path)
    assert "expected a finite number" in message or "expected a positive number" in message, message


@pytest.mark.parametrize(("raw", "problem"), [
    (1e308, "too long"), ("99999999999999999999h", "too long"), (10**400, "too long"), ("9" * 5000, "too long"),
    (float("nan"), "not finite"), (float("inf"), "not finite"), (-1, "negative"), ("soon", "not a duration"),
    (True, "not a duration"),
])
def test_parse_seconds_refuses(raw: object, problem: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_seconds(raw, where="--x")  # type: ignore[arg-type]
    assert info.value.problem == problem and str(info.value).startswith("--x: ")
    assert "\n" not in str(info.value)


def test_parse_seconds_takes_up_to_7_days() -> None:
    assert parse_seconds("168h", where="x") == MAX_SECONDS == parse_seconds(604800, where="x")
    assert parse_seconds("250ms", where="x") == 0.25


@pytest.mark.parametrize("deep", [
    "a = " + "[" * 500 + "]" * 500,  # tomllib recurses per array: RecursionError before it was caught
    "a = " + "{b = " * 500 + "1" + "}" * 500,
    "[" + ".".join(["a"] * 5000) + "]",  # parsed without recursion; every later walk would recurse
])
def test_a_profile_nested_too_deep_is_one_line(tmp_path: Path, deep: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(EXTERNAL + deep + "\n")
    assert _error(path).startswith("TOML nested too deep")


def test_an_error_quoting_a_key_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text(EXTERNAL.replace("[host]", '[host]\n"na\\nme" = 1'))
    assert _error(path) == "host.na\\nme: unknown key (did you mean 'name'?)"


def test_the_display_forms_mask_passwords(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text(SSH.replace("root@", "root:p@ss'w0rd@") + "\n[services.b]\nkind = \"external\"\n"
                    "url = \"https://user:s3cr3t-pass@api.example.com:8443\"\n")
    profile = load_profile(path)
    assert profile.connection == "ssh://root:p@ss'w0rd@10.0.0.1?timeout=4"  # what ssh is given
    assert profile.display_connection == f"ssh://root:{MASK}@10.0.0.1?timeout=4"
    assert profile.services["b"].url == "https://user:s3cr3t-pass@api.example.com:8443"
    assert profile.services["b"].display_url == f"https://user:{MASK}@api.example.com:8443"
    assert profile.services["a"].display_url == "http://10.0.0.1:30001"
    assert attach_profile("http://u:pw@h:1").services["attached"].display_url == f"http://u:{MASK}@h:1"


# ---- --fleet inventories: the same errors for the same bad values ------------------------------------------


@pytest.fixture(params=["builtin", pytest.param("ansible", marks=pytest.mark.skipif(
    ANSIBLE is None, reason="ansible-inventory is not installed (apt-get install ansible-core)"))])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(ANSIBLE_ENV, "none" if request.param == "builtin" else str(ANSIBLE))
    return str(request.param)


def _fleet_error(spec: Path, hosts_dir: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_fleet(str(spec), hosts_dir)
    line = error_line(info.value)
    assert "\n" not in line, line
    return line


BASE = SSH.replace('port = 30001', 'url = "http://{address}:30001"')


@pytest.mark.parametrize(("inventory", "expected"), [
    ('all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n    "a/b": {ansible_host: 10.0.0.1}\n',
     "{inv}: hosts: expected a host name without '/' or '\\' (it is split on '/' in test ids: host/service), "
     "got 'a/b'"),
    ('all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n    "a\\tb": {ansible_host: 10.0.0.1}\n',
     "{inv}: hosts: expected a host name without control or invisible characters, got 'a\\tb'"),
    ('all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n    g1: {ansible_host: "[fd00::1"}\n',
     "{dir}/base.toml (host g1 of inventory {name}): host.connection: expected local:// or ssh://[user@]host[:port][?timeout=N], got "
     "'ssh://[fd00::1' (malformed host"),
    ('all:\n  vars: {dflash_profile: big.toml}\n  hosts:\n    g1: {ansible_host: 10.0.0.1}\n',
     "{dir}/big.toml (host g1 of inventory {name}): services.a.ready_timeout: expected a duration of at most 7 days (604800s, 168h), got "
     "'99999999999999999999h'"),
    ('all:\n  vars: {dflash_profile: latin1.toml}\n  hosts:\n    g1: {ansible_host: 10.0.0.1}\n',
     "{dir}/latin1.toml: cannot read base profile: expected UTF-8 text, got byte 0xe9 at line 3"),
    (b'all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n    caf\xe9: {ansible_host: 10.0.0.1}\n',
     "{inv}: expected UTF-8 text, got byte 0xe9 at line 4 (offset 57): save the file as UTF-8"),
])
def test_an_inventory_gives_the_same_one_line_errors(tmp_path: Path, parser: str, inventory: str | bytes,
                                                     expected: str) -> None:
    (tmp_path / "base.toml").write_text(BASE)
    (tmp_path / "big.toml").write_text(EXTERNAL + 'ready_timeout = "99999999999999999999h"\n')
    (tmp_path / "latin1.toml").write_bytes(EXTERNAL.replace("[host]", '[host]\nname = "caf\xe9"').encode("latin-1"))
    inv = tmp_path / "fleet.yml"
    if isinstance(inventory, bytes):
        inv.write_bytes(inventory)
    else:
        inv.write_text(inventory)
    line = _fleet_error(inv, tmp_path)
    assert line.startswith(expected.format(inv=inv, dir=tmp_path, name=inv.name)), line


def test_an_ini_inventory_that_is_not_utf8_is_one_line(tmp_path: Path, parser: str) -> None:
    inv = tmp_path / "fleet.ini"
    inv.write_bytes(b"[gpus]\ncaf\xe9 dflash_profile=base.toml\n")
    assert _fleet_error(inv, tmp_path) == (f"{inv}: expected UTF-8 text, got byte 0xe9 at line 2 (offset 10): "
                                           "save the file as UTF-8")


def test_an_inventory_or_its_base_profile_nested_too_deep_is_one_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ANSIBLE_ENV, "none")  # the built-in YAML parser (ansible-inventory has its own errors)
    inv = tmp_path / "fleet.yml"
    inv.write_text("all:\n  vars: {dflash_profile: base.toml, x: " + "[" * 3000 + "]" * 3000 + "}\n")
    assert _fleet_error(inv, tmp_path).startswith(f"{inv}: YAML nested too deep")
    (tmp_path / "base.toml").write_text(BASE + "[" + ".".join(["a"] * 5000) + "]\n")
    inv.write_text("all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n    g1: {ansible_host: 10.0.0.1}\n")
    assert _fleet_error(inv, tmp_path).startswith(
        f"{tmp_path}/base.toml: cannot read base profile: TOML nested too deep")


def test_ansible_inventory_json_nested_too_deep_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ansible-inventory prints (a dynamic inventory script's JSON passes through it) nested too deep: one
    line naming the inventory. A real executable stands in for ansible-inventory and prints such JSON."""
    tool = tmp_path / "ansible-inventory"
    tool.write_text(f"#!{sys.executable}\nprint('[' * 100000)\n")
    tool.chmod(0o755)
    monkeypatch.setenv(ANSIBLE_ENV, str(tool))
    inv = tmp_path / "fleet.yml"
    inv.write_text("all:\n  hosts:\n    g1: {}\n")
    assert _fleet_error(inv, tmp_path).startswith(
        f"{inv}: ansible-inventory printed no JSON inventory (JSON nested too deep")


def test_an_ipv6_ansible_host_is_bracketed(tmp_path: Path, parser: str) -> None:
    (tmp_path / "base.toml").write_text(BASE)
    inv = tmp_path / "fleet.yml"
    inv.write_text("all:\n  vars: {dflash_profile: base.toml}\n  hosts:\n"
                   "    g1: {ansible_host: 'fd00::7', ansible_port: 2222}\n")
    (profile,) = load_fleet(str(inv), tmp_path)
    assert profile.connection == "ssh://[fd00::7]:2222?timeout=4"
    assert profile.services["a"].url == "http://[fd00::7]:30001"


def test_a_folder_fleet_gives_the_profiles_errors(tmp_path: Path) -> None:
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "a.toml").write_text(EXTERNAL + "sampled_timeout = 1e308\n")
    assert _fleet_error(tmp_path / "fleet", tmp_path) == (
        f"{tmp_path}/fleet/a.toml: services.a.sampled_timeout: expected a duration of at most 7 days "
        "(604800s, 168h), got 1e+308")
