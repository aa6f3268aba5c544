"""The plain server derived for tie triage, the prompt files, and the layer options."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from pytest_dflash.config.loader import load_profile
from pytest_dflash.layers.parity.plain import plain_service
from pytest_dflash.layers.parity.prompts import BUILTIN_PROMPTS, load_prompts
from pytest_dflash.run.records import RunOptions
from pytest_dflash.run.state import DflashRun, HostContext
from pytest_dflash.services.derive import PlainUnavailable, strip_speculative_args, strip_speculative_text
from pytest_dflash.services.plain import derive_plain_spec

ROOT = Path(__file__).parents[3]


def test_speculative_flags_and_their_values_go() -> None:
    command = ("{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1", "--port", "{port}",
               "--speculative-algorithm", "DDTREE", "--speculative-num-draft-tokens", "8",
               "--speculative-ddtree-budget", "32", "--enable-metrics", "--gpu-step-ms", "0.5")
    assert strip_speculative_args(command) == ("{python}", "-m", "pytest_dflash.refserver", "--host", "127.0.0.1",
                                               "--port", "{port}", "--enable-metrics", "--gpu-step-ms", "0.5")
    local = load_profile(ROOT / "hosts" / "local.toml")
    assert not any(a.startswith("--speculative") for a in strip_speculative_args(local.services["ddtree"].command))
    assert strip_speculative_args(["--speculative-algorithm=DFLASH", "--x", "--speculative-flag", "--y", "1"]) == (
        "--x", "--y", "1")


@pytest.mark.parametrize("unit", ["sglang-dflash.service", "sglang-ddtree.service"])
def test_unit_template_loses_its_speculative_flags_only(unit: str) -> None:
    text = (ROOT / "hosts" / "units" / unit).read_text()
    plain = strip_speculative_text(text)
    exec_start = next(line for line in " ".join(plain.split("\\\n")).splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    assert "--speculative" not in plain and "{draft}" not in plain
    assert words[:3] == ["{python}", "-m", "sglang.launch_server"]
    for kept in ("--model-path", "{model}", "--port", "{port}", "--attention-backend", "--enable-metrics"):
        assert kept in words
    assert plain.count("\n") <= text.count("\n")
    assert "[Service]" in plain and "Restart=no" in plain


def test_ct200_has_no_free_gpu_for_a_plain_server(tmp_path: Path) -> None:
    ct200 = load_profile(ROOT / "hosts" / "ct200.toml")
    with pytest.raises(PlainUnavailable, match=r"no free GPU .* host.gpus = \[0, 1\], in use \[0, 1\]"):
        derive_plain_spec(ct200.services["dflash"], ct200, directory=tmp_path, run_id="r1")


def test_systemd_plain_server_gets_a_spare_gpu_a_new_unit_and_port(tmp_path: Path) -> None:
    text = (ROOT / "hosts" / "ct200.toml").read_text().replace("gpus = [0, 1]", "gpus = [0, 1, 2]")
    profile_path = ROOT / "hosts" / "ct200-spare.toml"  # beside the real one: its templates are relative
    profile_path.write_text(text)
    try:
        profile = load_profile(profile_path)
    finally:
        profile_path.unlink()
    spec = derive_plain_spec(profile.services["dflash"], profile, directory=tmp_path, run_id="r1")
    assert (spec.name, spec.kind, spec.algorithm, spec.gpus, spec.port) == ("dflash-plain", "systemd", "NONE", (2,),
                                                                          30101)
    assert spec.unit == "sglang-dflash-smoke-plain.service" and spec.url == "http://10.1.2.200:30101"
    assert spec.vars == profile.services["dflash"].vars and spec.template is not None
    assert "--speculative" not in spec.template.read_text()
    assert derive_plain_spec(profile.services["dflash"], profile, directory=tmp_path, run_id="r1", port=31000).port == 31000


def test_process_plain_server_gets_a_free_port() -> None:
    local = load_profile(ROOT / "hosts" / "local.toml")
    spec = derive_plain_spec(local.services["dflash"], local, directory=Path("/nonexistent"), run_id="r1")
    assert spec.kind == "process" and spec.port is None and spec.url == "http://127.0.0.1:{port}"
    assert "--speculative-algorithm" not in spec.command and "{port}" in spec.command


def test_builtin_prompts_cover_short_long_code_and_repetitive_text() -> None:
    names = {p.name for p in BUILTIN_PROMPTS}
    assert {"short", "long", "code", "repetitive"} <= names
    assert len(next(p for p in BUILTIN_PROMPTS if p.name == "long").text) > 800


def test_prompt_files(tmp_path: Path) -> None:
    json_file = tmp_path / "p.json"
    json_file.write_text(json.dumps(["one", {"name": "two", "text": "def f():\n    return 2\n"}]))
    assert [(p.name, p.text) for p in load_prompts(json_file)] == [("p[0]", "one"),
                                                                    ("two", "def f():\n    return 2\n")]
    text_file = tmp_path / "p.txt"
    text_file.write_text("# comment\nfirst prompt\n\nsecond prompt\n")
    assert [p.text for p in load_prompts(text_file)] == ["first prompt", "second prompt"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="bad.json: expected a JSON list of prompts"):
        load_prompts(bad)
    with pytest.raises(ValueError, match="cannot read the prompts file"):
        load_prompts(tmp_path / "missing.txt")


def test_options_parse_and_bad_values_name_their_flag(pytester: pytest.Pytester, tmp_path: Path) -> None:
    prompts = tmp_path / "extra.txt"
    prompts.write_text("an extra prompt\n")
    config = pytester.parseconfigure("--parity-prompts", str(prompts), "--dist-samples", "300", "--dist-tokens", "3",
                                     "--parity-tie-gap", "0.01", "--ddtree-accept-ratio", "off")
    from pytest_dflash.layers.parity.hooks import OPTIONS_KEY

    options = config.stash[OPTIONS_KEY]
    assert [p.text for p in options.extra_prompts] == ["an extra prompt"]
    assert (options.draw.count, options.draw.tokens, options.tie_gap, options.accept_ratio) == (300, 3, 0.01, None)
    assert options.prompts()[-1].text == "an extra prompt" and len(options.prompts()) == len(BUILTIN_PROMPTS) + 1
    for args, message in [(["--dist-samples", "many"], "--dist-samples / dflash_dist_samples: 'many' is not an integer"),
                          (["--parity-max-tie-rate", "2"], "--parity-max-tie-rate / dflash_parity_max_tie_rate: '2' "
                                                           "must be [0, 1]"),
                          (["--parity-prompts", str(tmp_path / "none.json")], "cannot read the prompts file")]:
        with pytest.raises(pytest.UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
            pytester.parseconfigure(*args)


def test_ini_keys_work_like_the_flags(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndflash_dist_alpha = 0.01\ndflash_gen_concurrency = 4\n")
    from pytest_dflash.layers.parity.hooks import OPTIONS_KEY

    options = pytester.parseconfigure().stash[OPTIONS_KEY]
    assert (options.alpha, options.concurrency) == (0.01, 4)


def _host(name: str, *, provision: bool) -> HostContext:
    profile = load_profile(ROOT / "hosts" / f"{name}.toml")
    return DflashRun({profile.name: profile}, RunOptions(provision=provision), "r1").host(profile.name)


def test_plain_server_is_the_profiles_plain_or_a_none_service() -> None:
    local = _host("local", provision=False)
    assert plain_service(local.service("dflash")).name == "none"  # [parity] plain = "none"


def test_attach_mode_without_a_plain_service_says_how_to_get_one() -> None:
    ct200 = _host("ct200", provision=False)
    with pytest.raises(PlainUnavailable, match=r"set \[parity\] plain = \"NAME\" in the profile, or run with "
                                               r"--provision"):
        plain_service(ct200.service("dflash"))
    assert "dflash-plain" not in ct200.services


def test_provisioning_without_a_free_gpu_derives_nothing() -> None:
    ct200 = _host("ct200", provision=True)
    with pytest.raises(PlainUnavailable, match="no free GPU for a plain server beside dflash"):
        plain_service(ct200.service("dflash"))
    assert "dflash-plain" not in ct200.services and not ct200.notes


def test_an_attached_server_is_plain_when_its_algorithm_is_none_not_while_it_is_unknown(tmp_path: Path) -> None:
    """Any kind may be the plain server, an attached one too, if its algorithm is NONE; an attached server whose
    algorithm is still unknown (auto, not read from /server_info) is none."""
    for algorithm, plain in (("NONE", "base"), ("auto", None)):
        path = tmp_path / f"attached-{algorithm}.toml"
        path.write_text(f'[host]\nname = "attached-{algorithm}"\nconnection = "local://"\n\n'
                        '[services.dflash]\nkind = "external"\nurl = "http://127.0.0.1:30000"\nalgorithm = "DFLASH"\n\n'
                        f'[services.base]\nkind = "external"\nurl = "http://127.0.0.1:30001"\nalgorithm = "{algorithm}"\n')
        profile = load_profile(path)
        host = DflashRun({profile.name: profile}, RunOptions(), "r1").host(profile.name)
        if plain:
            assert plain_service(host.service("dflash")).name == plain
        else:
            with pytest.raises(PlainUnavailable, match="no plain"):
                plain_service(host.service("dflash"))
