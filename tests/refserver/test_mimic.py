"""--mimic-version (pytest_dflash/refserver/mimic.py): a later release's differences, on real 0.5.17 answers recorded
on the H200 and through the real argparse-style exit the catalog reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pytest_dflash.evidence.diagnosis import diagnose
from pytest_dflash.layers.gpu.flags import REMOVED_FLAGS
from pytest_dflash.refserver.mimic import KNOWN, META_ALIASES, MIRRORED, REMOVED, Mimic, split_argv

PROBE = json.loads((Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200-ddtree" / "run3-fi-warm" /
                    "probe_ddtree_flashinfer.json").read_text(encoding="utf-8"))
META = PROBE["probes"][0]["response"]["meta_info"]  # a real 0.5.17 DDTREE generation's meta_info
ARGV = ["--model-path", "/m", "--speculative-algorithm", "DFLASH", "--speculative-dflash-draft-window-size", "512"]


def test_its_rows_are_the_env_layers() -> None:
    table = {r.flag: (r.removed_in, r.replacement) for r in REMOVED_FLAGS}
    assert {flag: table[flag] for flag in REMOVED} == REMOVED


def test_a_removed_flag_exits_as_sglang_does_and_the_catalog_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        split_argv(["--mimic-version", "0.5.23", *ARGV])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "launch_server.py: error: unrecognized arguments: --speculative-dflash-draft-window-size 512" in err
    assert [d.id for d in diagnose(err)][:1] == ["sglang-flag-removed"]


def test_a_release_that_takes_the_alias_warns_in_sglangs_words() -> None:
    mimic, rest = split_argv([*ARGV, "--mimic-version=0.5.19"])
    assert mimic == Mimic("0.5.19") and rest == ARGV
    (line,) = mimic.deprecation_lines(rest)
    assert line == ("'--speculative-dflash-draft-window-size' is deprecated and will be removed in a future release. "
                    "Use '--speculative-draft-window-size' instead.")
    assert diagnose(line) == []  # a healthy start with the old spelling is no failure
    assert split_argv(ARGV)[0].version == MIRRORED == "0.5.17"
    assert Mimic("0.5.23").deprecation_lines(["--cuda-graph-max-bs-decode", "8"]) == []


def test_an_unknown_release_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        split_argv(["--mimic-version", "0.6.0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (f"launch_server.py: error: --mimic-version: '0.6.0' is not a release the "
                                       f"refserver knows ({', '.join(KNOWN)})\n")


@pytest.mark.parametrize(("version", "aliases"), [("0.5.17", True), ("0.5.20", True), ("0.5.21", False),
                                                  ("0.5.23", False)])
def test_meta_info_loses_the_aliases_in_0_5_21(version: str, aliases: bool) -> None:
    meta = Mimic(version).meta_info(copy.deepcopy(META))
    assert all((alias in meta) is aliases for alias in META_ALIASES)
    assert meta["spec_num_correct_drafts"] == META["spec_accepted_drafts"]  # what stays carries the same number
    assert meta["spec_correct_drafts_histogram"] == META["spec_accept_histogram"]


def test_server_info_model_info_and_routes_by_release() -> None:
    real = copy.deepcopy(PROBE["server_info"])
    assert real["version"] == "0.5.17" and "launch_command" not in real
    old = Mimic("0.5.17")
    assert old.server_info(copy.deepcopy(real), ARGV) == real
    new = Mimic("0.5.23").server_info(copy.deepcopy(real), ARGV)
    assert new["version"] == "0.5.23" and new["frontend"] == "python"
    # SGLang joins sys.argv[1:]: the arguments alone, no program (0.5.20 sglang/srt/server_args.py:736)
    assert new["launch_command"] == ("--model-path /m --speculative-algorithm DFLASH "
                                     "--speculative-dflash-draft-window-size 512")
    assert "served_model_name" not in old.model_info({}, "tiny")
    assert Mimic("0.5.18").model_info({}, "tiny") == {"served_model_name": "tiny"}
    assert [Mimic(v).has_route("/ready") for v in ("0.5.19", "0.5.20")] == [False, True]
    assert [Mimic(v).has_route("/get_load") for v in ("0.5.20", "0.5.21")] == [True, False]
    assert Mimic("0.5.23").has_route("/v1/loads")
