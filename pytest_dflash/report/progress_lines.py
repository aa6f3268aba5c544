"""A progress line as it travels from whoever says it to the terminal (and, under xdist, through a worker's
progress file): its text, scrubbed, and its kind (heartbeat, event, fleet state) (report/progress.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pytest_dflash.documents import loads_json
from pytest_dflash.scrub.bounds import LINE_BYTES, scrub
from pytest_dflash.services.events import Heartbeat, ServiceEvent


@dataclass(frozen=True)
class Line:
    """One progress line as it travels: its kind, its text (already scrubbed) and the fleet state it
    reports."""

    text: str
    heartbeat: bool = False
    fleet: tuple[str, str, str] | None = None  # (host, service, "started" | "ready" | "failed")

    def to_json(self) -> bytes:
        data: dict[str, Any] = {"kind": "heartbeat" if self.heartbeat else "event", "text": self.text}
        if self.fleet is not None:
            data["fleet"] = list(self.fleet)
        return (json.dumps(data, ensure_ascii=True) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Line | None:
        try:
            data = loads_json(raw)
            if not isinstance(data, dict):
                return None
            fleet = data.get("fleet")
            return cls(text=str(data["text"]), heartbeat=data.get("kind") == "heartbeat",
                       fleet=(str(fleet[0]), str(fleet[1]), str(fleet[2])) if fleet else None)
        except (ValueError, KeyError, TypeError, IndexError):
            return None


def classify(message: str) -> Line:
    fleet = (message.host, message.service, message.state) if isinstance(message, ServiceEvent) else None
    return Line(text=scrub(str(message), LINE_BYTES, "progress line"),
                heartbeat=isinstance(message, Heartbeat), fleet=fleet)
