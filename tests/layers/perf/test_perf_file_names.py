"""The perf layer's files (reports/perf/<host>/<service>.json and plots, baselines/<host>/<service>.json) are named
injectively: two hosts or two services never share a file, whatever their names hold (case, '/', ':', ' ', '_',
non-ASCII); names a profile writes anyway stay as they are; a baseline recorded under the lossy names used before
is still found, but only by the host and service it was recorded for."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

from perf_fakes import fake_run

from pytest_dflash.config.targets import file_name
from pytest_dflash.layers.perf.baseline import baseline_path, load_baseline, recorded_baseline, save_baseline
from pytest_dflash.layers.perf.book import perf_file

HOSTS = ["gpu a", "gpu_a", "gpu:a", "gpu/a", "GPU a", "Gpu_a", "gpü a", "gpu%20a", "gpu-a", "127.0.0.1:8000",
         "127.0.0.1_8000"]
SERVICES = ["dflash", "Dflash", "d flash", "d_flash", "d:flash", "d/flash", "dfläsh", "d%20flash", "d-flash"]


def test_distinct_hosts_and_services_never_share_a_perf_file_or_a_baseline(tmp_path: Path) -> None:
    """Every (host, service) pair written into one folder, as a run of many hosts writes them: each file is still
    there afterwards with its own content (none overwrote another, none escaped its folder)."""
    pairs = list(itertools.product(HOSTS, SERVICES))
    for naming in ("perf", "baseline"):
        paths = {pair: (perf_file(tmp_path, *pair) if naming == "perf" else baseline_path(tmp_path / "b", *pair))
                 for pair in pairs}
        assert len(set(paths.values())) == len(pairs), naming
        for (host, service), path in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps([host, service]), encoding="utf-8")
        for (host, service), path in paths.items():
            assert json.loads(path.read_text(encoding="utf-8")) == [host, service], (naming, host, service, path)
            root = tmp_path / "perf" if naming == "perf" else tmp_path / "b"
            assert path.parent.parent == root, path  # one folder per host, right under the root
    plot = perf_file(tmp_path, "gpu a", "d_flash", ".latency_cdf.svg")
    assert plot.name == "d_flash.latency_cdf.svg" and plot.parent == perf_file(tmp_path, "gpu a", "x").parent


def test_names_stay_readable_and_a_hosts_folder_is_named_as_its_verdict_file(tmp_path: Path) -> None:
    # every name a profile may give a service ([A-Za-z0-9_][A-Za-z0-9_.-]*) is kept: baselines keep their files
    assert baseline_path(tmp_path, "h200", "dflash_acc_fi") == tmp_path / "h200" / "dflash_acc_fi.json"
    assert perf_file(tmp_path, "gpu-a.lab", "plain.v2") == tmp_path / "perf" / "gpu-a.lab" / "plain.v2.json"
    # an attached server's host:port: as its verdict file, 127.0.0.1_8000.verdict.json
    attached = perf_file(tmp_path, "127.0.0.1:8000", "attached")
    assert attached == tmp_path / "perf" / "127.0.0.1_8000" / "attached.json"
    for host in HOSTS:
        assert perf_file(tmp_path, host, "s").parent.name == file_name(host)
    assert perf_file(tmp_path, "gpu a", "d:flash").name == "d%3Aflash.json"


def test_a_baseline_recorded_under_the_old_lossy_name_is_read_only_by_its_own_host(tmp_path: Path) -> None:
    """Before, `gpu a`, `gpu:a` and `gpu_a` all wrote baselines/gpu_a/: a file there is read back for the host it
    says it was recorded for (a skipped "no baseline" would hide a regression), never for another; once
    recorded again at the injective name, that file wins."""
    old = tmp_path / "gpu_a" / "dflash.json"
    save_baseline(dataclasses.replace(fake_run(e2e_ms=100.0), host="gpu a"), old)
    assert recorded_baseline(tmp_path, "gpu a", "dflash") == old
    assert load_baseline(old).result.records
    assert recorded_baseline(tmp_path, "gpu:a", "dflash") is None  # the same lossy name, another host's file
    assert recorded_baseline(tmp_path, "gpu a", "other") is None
    new = save_baseline(dataclasses.replace(fake_run(e2e_ms=90.0), host="gpu a"),
                        baseline_path(tmp_path, "gpu a", "dflash"))
    assert new == tmp_path / "gpu%20a" / "dflash.json" and recorded_baseline(tmp_path, "gpu a", "dflash") == new
    assert recorded_baseline(tmp_path, "gpu_a", "dflash") is None  # gpu_a's own name is gpu%5Fa: nothing there
