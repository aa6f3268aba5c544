"""The packaged suites, run as a user runs them after `pip install` (README, "Without a clone"): from a
directory that is not this checkout, with the venvs of install_venvs.py (the wheel and its declared
dependencies from the index, nothing of this venv).

- the base install (the controller, no torch) attached by URL to a refserver started from this venv;
- the [refserver] install on the embedded `local` host (three refservers it starts itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from install_venvs import clean_env, run

from pytest_dflash.refserver.launch import RefServerProcess


def _verdict(reports: Path, host_file: str) -> dict:  # type: ignore[type-arg]
    return json.loads((reports / f"{host_file}.verdict.json").read_text())


@pytest.mark.timeout(900)  # the first install test of a session may build the venv (~1 min)
def test_the_base_install_runs_the_smoke_suite_attached_by_url(base_venv: Path, elsewhere: Path) -> None:
    python = base_venv / "bin" / "python"
    where = run(python, "-c", "import pytest_dflash.suites.smoke as s; print(s.__file__)", cwd=elsewhere,
                timeout=60).stdout
    assert where.startswith(str(base_venv)), where  # the installed copy, not this checkout
    # whitespace-free JSON, as `--host local`'s profile: the random model then closes smoke's constrained
    # answer within its 48 tokens, judged whole by jsonschema (a base install has no grammar matcher)
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--constrained-json-disable-any-whitespace") as server:
        done = run(python, "-m", "pytest", "--pyargs", "pytest_dflash.suites.smoke", "--attach", server.url, "-q",
                   "-p", "no:cacheprovider", cwd=elsewhere, timeout=300, check=False,
                   env=clean_env({"DFLASH_STATE_DIR": str(elsewhere / "state")}))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    data = _verdict(elsewhere / "reports", server.url.removeprefix("http://").replace(":", "_"))
    assert data["verdict"] == "pass" and data["complete"] and data["exit_code"] == 0, json.dumps(data)[:2000]
    assert data["selection"]["suites"] == ["smoke"]


@pytest.mark.timeout(900)  # the first install test of a session may build the venv (~1 min, 2.3 GB)
def test_the_refserver_install_runs_the_smoke_suite_on_the_local_host(refserver_venv: Path,
                                                                      elsewhere: Path) -> None:
    python = refserver_venv / "bin" / "python"
    env = clean_env({"DFLASH_STATE_DIR": str(elsewhere / "state")})
    out = run(python, "-m", "pytest", "--pyargs", "pytest_dflash.suites.smoke", "--host", "local", "-q",
              "-p", "no:cacheprovider", cwd=elsewhere, env=env, timeout=300).stdout
    assert "local: PASS" in out, out[-3000:]
    data = _verdict(elsewhere / "reports", "local")
    assert data["verdict"] == "pass" and data["complete"] and data["exit_code"] == 0, json.dumps(data)[:2000]
    assert data["selection"]["suites"] == ["smoke"]
    assert data["profile"].startswith(str(refserver_venv)), data["profile"]  # the builtin profile it ships
    assert set(data["services"]) == {"none", "dflash", "ddtree"}

    # One suite other than smoke, by --pyargs and under xdist (node ids relative to the package): a declared
    # scope, so a pass of the checks it defines (docs/gating.md).
    host_only = run(python, "-m", "pytest", "--pyargs", "pytest_dflash.suites.host", "--host", "local", "-q",
                    "-p", "no:cacheprovider", "-n", "2", "--dflash-report", "r2", cwd=elsewhere, env=env,
                    timeout=300).stdout
    data = _verdict(elsewhere / "r2", "local")
    assert data["verdict"] == "pass" and data["selection"]["suites"] == ["host"], host_only[-3000:]


@pytest.mark.timeout(900)
def test_the_base_install_on_the_local_host_names_the_extra_it_needs(base_venv: Path, elsewhere: Path) -> None:
    """`--host local` runs the embedded reference host with this venv's python: without [refserver] that is a
    one-line usage error naming the extra, not an env layer failing on a missing torch (or soundfile)."""
    done = run(base_venv / "bin" / "python", "-m", "pytest", "--pyargs", "pytest_dflash.suites.smoke", "--host",
               "local", "-q", "-p", "no:cacheprovider", cwd=elsewhere, timeout=120, check=False,
               env=clean_env({"DFLASH_STATE_DIR": str(elsewhere / "state")}))
    out = done.stdout + done.stderr
    assert done.returncode == 4, out[-3000:]
    assert "runs the embedded reference host with this interpreter" in out, out[-3000:]
    assert "lacks torch, fastapi, uvicorn: pip install 'pytest-dflash[refserver]'" in out, out[-3000:]
    assert "Traceback" not in out
