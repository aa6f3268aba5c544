"""The GPU x service matrix in the HTML report (pytest_dflash.report.gpus)."""

from __future__ import annotations

from pytest_dflash.report.gpus import gpu_matrix_section

BAD = "GPU 5 (bus 0000:ab:00.0, GPU-caedbb52-a7ac-b6fb-867b-b909a3c8cf25)"


def test_the_html_report_shows_the_gpu_service_matrix() -> None:
    """report/gpus.py: a bad GPU's row names what was found and the services it blocked; a healthy one says ok."""
    matrix = {"0": {"gpu": "GPU 0 (bus 0000:18:00.0, GPU-…20)", "services": ["ddtree"], "problems": []},
              "5": {"gpu": BAD, "services": ["tp4"], "problems": ["the kernel log reports GPU faults since boot "
                                                                  "(Xid codes [79]): <Xid 79>"]}}
    page = gpu_matrix_section({"hgx": {"gpu_matrix": matrix}, "cpu": {}})
    assert page.startswith("<h2>dflash GPUs</h2>") and page.count("<table") == 1
    assert '<tr data-gpu="0"><td>GPU 0 (bus 0000:18:00.0, GPU-…20)</td><td>ddtree</td>' in page and ">ok<" in page
    assert "bad: the kernel log reports GPU faults since boot (Xid codes [79]): &lt;Xid 79&gt; (blocks tp4)" in page
    assert gpu_matrix_section({"cpu": {}}) == ""


def test_the_fleet_summary_shows_a_failing_hosts_gpu_matrix() -> None:
    """fleet-summary.html: the failing host's section carries its GPU x service table."""
    from pytest_dflash.fleet.html import _host_section

    entry = {"run_id": "r", "finished": "t", "failures": [], "blocked": [], "notes": [], "services": {},
             "gpu_matrix": {"5": {"gpu": BAD, "services": ["tp4"], "problems": ["Xid 79"]}}}
    page = "".join(_host_section("hgx", entry))
    assert 'class="dflash-gpu-matrix" data-host="hgx"' in page and "bad: Xid 79 (blocks tp4)" in page
