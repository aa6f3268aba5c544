"""The progress lines a service's start-up and readiness say. Each is a ``str``, so every `Progress` callable
takes it; its kind rides on its class (report/progress.py shows them): a `Heartbeat` repeats a state, a
`ServiceEvent` moves the fleet counts, any other ``str`` is an event."""

from __future__ import annotations

from collections.abc import Callable

# Where progress lines go (report/progress.py shows them); thread-safe where a run's background waits say
# theirs.
Progress = Callable[[str], None]


class Heartbeat(str):
    """A progress line that repeats a state ("waiting 40s in sampled phase: …"): shown at most once per
    service per ~10 s, not at all with -q (report/progress.py). A ``str``, so every Progress callable takes
    it."""

    __slots__ = ()



class ServiceEvent(str):
    """A progress line saying a service was started, became ready or failed (``state``)."""

    host: str
    service: str
    state: str

    def __new__(cls, text: str, *, host: str, service: str, state: str) -> ServiceEvent:
        line = super().__new__(cls, text)
        line.host, line.service, line.state = host, service, state
        return line
