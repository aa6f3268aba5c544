"""The connection side of a client: one SSL context for every client, whether the environment's proxy stands
between the client and a host, and a liveness probe that is one TCP connect (no HTTP)."""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.request
from typing import Any

import httpx

__all__ = ["REUSE_IDLE_S", "proxied", "ssl_context", "tcp_refused"]

# SGLang's uvicorn closes a connection idle for 5 s (timeout_keep_alive=5); httpx would reuse one idle for up
# to 5 s, so a request could meet the server's close on its way in: a reset a healthy server never meant.
# Reuse only connections idle for less than this; older ones are closed and a fresh one costs a TCP connect.
REUSE_IDLE_S = 2.0

_SSL_LOCK = threading.Lock()
_SSL: ssl.SSLContext | None = None


def ssl_context() -> ssl.SSLContext:
    """httpx's own default context (its CA bundle, SSL_CERT_FILE / SSL_CERT_DIR), built once per process."""
    global _SSL
    with _SSL_LOCK:
        if _SSL is None:
            _SSL = httpx.create_ssl_context()
        return _SSL


def proxied(host: str) -> bool:
    """Would httpx (trust_env) send a request for `host` through a proxy named in the environment?"""
    proxies = urllib.request.getproxies()
    return any(proxies.get(k) for k in ("http", "https", "all")) and not urllib.request.proxy_bypass(host)


def tcp_refused(addresses: list[Any], timeout_s: float) -> bool | None:
    """Does every address of `addresses` (getaddrinfo's) refuse a TCP connect? True when one refused and none
    accepted, False when one accepted, None when no answer was conclusive (unreachable, timed out)."""
    refused = False
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.settimeout(timeout_s)
                probe.connect(address)
            return False
        except ConnectionRefusedError:
            refused = True
        except OSError:
            pass  # unreachable, timed out: not conclusive
    return refused if refused else None
