"""Logging to stderr in SGLang's shape: ``[YYYY-MM-DD HH:MM:SS] message``, uvicorn lines included."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["DATEFMT", "setup_logging", "uvicorn_log_config"]

DATEFMT = "%Y-%m-%d %H:%M:%S"
FORMAT = "[%(asctime)s] %(message)s"


def setup_logging(level: str) -> logging.Logger:
    """Route every refserver logger to stderr with SGLang's prefix."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logger = logging.getLogger("pytest_dflash.refserver")
    logger.setLevel(level.upper())
    return logger


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's loggers with SGLang's formats:
    ``[ts] INFO:     127.0.0.1:PORT - "GET / HTTP/1.1" 200 OK``."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "[%(asctime)s] %(levelprefix)s %(message)s",
                "datefmt": DATEFMT,
                "use_colors": False,
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
                "datefmt": DATEFMT,
                "use_colors": False,
            },
        },
        "handlers": {
            "default": {"formatter": "default", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
            "access": {"formatter": "access", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["access"], "level": level.upper(), "propagate": False},
        },
    }
