"""SGLang's own accept-length counters, read around a run: ``POST /flush_cache`` resets them,
``GET /server_info`` reads ``avg_spec_accept_length`` (:func:`flush_cache`, :func:`server_accept_length`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Mapping

import httpx

from pytest_dflash.documents import loads_json

__all__ = ["flush_cache", "server_accept_length"]




async def flush_cache(base_url: str, *, headers: Mapping[str, str] | None = None,
                      timeout_s: float = 30.0) -> bool:
    """POST /flush_cache (resets SGLang's accept-length counters); False when refused (busy: 400).

    Bounded by `timeout_s` of total time (httpx.ReadTimeout), not only per read."""
    async with _total_time("POST /flush_cache", timeout_s), httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=dict(headers or {}), trust_env=False) as client:
        resp = await client.post("/flush_cache")
        return resp.status_code == 200


@contextlib.asynccontextmanager
async def _total_time(what: str, timeout_s: float) -> AsyncIterator[None]:
    """`timeout_s` of total time for `what`; running out of it is an httpx.ReadTimeout naming the call and
    limit."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError:
        raise httpx.ReadTimeout(f"{what}: no complete answer within {timeout_s:g}s (total time)") from None


async def server_accept_length(base_url: str, *, headers: Mapping[str, str] | None = None,
                               timeout_s: float = 30.0) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` from /server_info (old: /get_server_info).

    It is cumulative since the server started or since the last successful /flush_cache. Bounded by
    `timeout_s` of total time (httpx.ReadTimeout), not only per read.
    """
    async with _total_time("GET /server_info", timeout_s), httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=dict(headers or {}), trust_env=False) as client:
        resp = await client.get("/server_info")
        if resp.status_code == 404:
            resp = await client.get("/get_server_info")
        resp.raise_for_status()
        info = loads_json(resp.content)  # ValueError (not JSON, nested too deep) to the caller
    states = info.get("internal_states") if isinstance(info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None
