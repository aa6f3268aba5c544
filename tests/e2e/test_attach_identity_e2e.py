"""Attached services know what they are (issue 11, item 9): `--attach URL` and `kind = "external"` take their
algorithm from /server_info before tests are selected, and the service layer fails when /v1/models,
/model_info, /server_info and the profile's `model` disagree. Real pytest runs against real refservers."""

from __future__ import annotations

from pathlib import Path

from support.pytest_runs import assert_no_crash, verdict

from pytest_dflash.refserver.launch import RefServerProcess

SPECULATIVE_ONLY = ("test_accept_length", "test_ddtree_accepts_at_least_dflash")


def host_name(url: str) -> str:
    return url.removeprefix("http://").replace(":", "_")


def collected(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [line for line in result.stdout.lines if "::" in line]


def test_an_attached_plain_server_gets_no_speculative_only_tests_and_passes_parity(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "NONE") as server:
        listing = run_suite(["smoke", "parity"], "--attach", server.url, "--collect-only", "-q")
        result = run_suite("parity", "--attach", server.url)
    assert_no_crash(result)
    ids = collected(listing)
    # a speculative-only test is there once per host, as a skip that says it does not apply: never per service
    assert ids and not [i for i in ids if any(name in i for name in SPECULATIVE_ONLY) and "/" in i.split("[")[-1]], ids
    assert any("test_serves_the_profiles_algorithm" in i for i in ids), ids
    assert "no accept length" not in result.stdout.str()
    assert not [i for i in ids if "NOTSET" in i], ids
    assert result.ret == 0, result.stdout.str()[-3000:]


def test_an_attached_dflash_server_is_selected_as_dflash(run_suite) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        listing = run_suite("smoke", "--attach", server.url, "--collect-only", "-q")
        result = run_suite("smoke", "--attach", server.url)
    assert_no_crash(result)
    assert any("test_accept_length" in i for i in collected(listing)), listing.stdout.str()
    data = verdict(run_suite.reports, host_name(server.url))
    assert data["tests_verdict"] == "pass", result.stdout.str()[-3000:]
    assert data["services"]["attached"]["algorithm"] == "DFLASH"
    assert "acceptance:attached" in data["metrics"] or data["services"]["attached"].get("accept_length")


def _external_profile(tmp_path: Path, url: str, model: str | None, algorithm: str | None) -> Path:
    lines = ["[host]", 'name = "ext"', 'connection = "local://"', "", "[services.dflash]", 'kind = "external"', f'url = "{url}"']
    if algorithm:
        lines.append(f'algorithm = "{algorithm}"')
    if model:
        lines.append(f'model = "{model}"')
    path = tmp_path / "ext.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_external_service_serving_another_model_fails_the_service_layer(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "DFLASH") as server:
        profile = _external_profile(tmp_path, server.url, "Qwen/Qwen3-8B", None)
        result = run_suite("service", "--host", str(profile))
    assert_no_crash(result)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FAILED*test_serves_one_consistent_model*"])
    assert "the profile's model 'Qwen/Qwen3-8B' is none of what the server names" in result.stdout.str()
    data = verdict(run_suite.reports, "ext")
    assert data["layers"]["service"]["outcome"] == "failed"
    assert data["services"]["dflash"]["algorithm"] == "DFLASH"  # no `algorithm` in the profile: read at collection


def test_an_external_service_declared_dflash_serving_plain_fails(run_suite, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with RefServerProcess("--speculative-algorithm", "NONE") as server:
        profile = _external_profile(tmp_path, server.url, None, "DFLASH")
        result = run_suite("service", "--host", str(profile))
    assert_no_crash(result)
    assert result.ret == 1
    assert "the profile says DFLASH, the server runs NONE" in result.stdout.str()
