"""Fixtures for the refserver tests: the model in-process, a scheduler in-process, real servers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from refserver_helpers import DATA

from pytest_dflash.refserver.launch import RefServerProcess
from pytest_dflash.refserver.model import ModelConfig, TinyLM

torch.set_num_threads(1)  # the servers under test share two cores with this process


@pytest.fixture(scope="session")
def model() -> TinyLM:
    return TinyLM(ModelConfig(), seed=0)


@pytest.fixture(scope="session")
def recorded() -> dict[str, Any]:
    """Responses of a real SGLang 0.5.17 DFLASH / plain server (see tests/data/.../README.md)."""
    data: dict[str, Any] = json.loads((DATA / "responses.json").read_text())
    return data


@pytest.fixture(scope="module")
def none_server() -> Iterator[RefServerProcess]:
    with RefServerProcess("--enable-metrics", "--random-seed", "1") as server:
        yield server


@pytest.fixture(scope="module")
def dflash_server() -> Iterator[RefServerProcess]:
    with RefServerProcess("--speculative-algorithm", "DFLASH", "--enable-metrics") as server:
        yield server


@pytest.fixture(scope="module")
def ddtree_server() -> Iterator[RefServerProcess]:
    with RefServerProcess("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "24") as server:
        yield server
