"""Size limits for everything a test report carries out of the process (terminal, JUnit, HTML, verdict JSON).

A server that answers megabytes, a log with 30 KB lines or an assertion that embeds a whole response
must not turn a CI artefact into a 100 MB file. Every text is cut to a limit, and the cut is said in
the text itself: ``[… 81,234 bytes cut: cap 8 KB per report section]``. Limits are UTF-8 bytes and
include that marker; what is kept is the head, the tail or both, whichever tells more:

    ITEM_BYTES      8 KB  one report section, note or fact string, a diagnosis
    LOG_BYTES      16 KB  a log / journal tail (the end is kept: that is where the crash is)
    LONGREPR_BYTES 16 KB  a failure's report text (head and tail: the assertion and where it failed)
    LINE_BYTES      1 KB  one-line texts: verdict messages, skip reasons, progress lines, summaries
    PROPERTY_BYTES 32 KB  the `dflash` user property as JSON (JUnit properties, the verdict)
    TEST_BYTES    128 KB  everything one test report carries: failure text + sections + property
    LOG_READ_BYTES  4 MB  what one read of a log brings INTO the process (its end, cut where the log is
                          read: `tail -c` on the host, a seek for a local file), whatever the log holds

Redact before cutting (`scrub`): a cut can separate a secret from the name that marks it as one.
`failure_text` is a service failure as a test fails with it: its message and its log's last lines, scrubbed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pytest_dflash.scrub.redact import redact, redact_mapping_value
from pytest_dflash.scrub.terminal import terminal_safe

__all__ = ["ITEM_BYTES", "LINE_BYTES", "LOG_BYTES", "LOG_READ_BYTES", "LOG_TAIL_LINES", "LONGREPR_BYTES",
           "MAX_ENTRIES", "PROPERTY_BYTES", "TEST_BYTES", "Keep", "bound_obj", "cap", "clip", "failure_text",
           "human", "nbytes", "scrub"]

KB = 1024
ITEM_BYTES = 8 * KB
LOG_BYTES = 16 * KB
LONGREPR_BYTES = 16 * KB
LINE_BYTES = 1 * KB
PROPERTY_BYTES = 32 * KB
TEST_BYTES = 128 * KB
# Enough for the 20,000 lines the speculation check reads of a start-up log, far less than a log can print.
LOG_READ_BYTES = 4 * KB * KB
MAX_ENTRIES = 100  # of one list in a property (notes, diagnoses): the rest is counted, not kept
LOG_TAIL_LINES = 40  # of the service log in a failure message (the full window is its own report section)

Keep = Literal["head", "tail", "both"]
_MIN_LIMIT = 96  # room for the marker and a little text
_SNAP = 256  # cut at a line break if one is this close: a log tail should start with a whole line


def clip(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: whole, or cut after its last whole word in reach, with "…" (a
    summary's failure message read "… befor", a schema "…additi", where each was cut at a fixed length)."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return (text[:cut] if cut > limit // 2 else text[:limit - 1]).rstrip() + "…"


def human(size: int) -> str:
    """8192 -> '8 KB', 1536 -> '1.5 KB', 300 -> '300 B' (how a cap is stated in the text)."""
    if size >= KB * KB:
        return f"{size / (KB * KB):g} MB"
    if size >= KB:
        return f"{size / KB:.4g} KB"
    return f"{size} B"


def nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _marker(cut: int, limit: int, what: str) -> str:
    return f"[… {cut:,} bytes cut: cap {human(limit)} per {what}]"


def cap(text: str, limit: int, what: str, *, keep: Keep = "both") -> str:
    """`text` cut to at most `limit` UTF-8 bytes, the marker included, saying how much was cut and why.

    `what` names the item in the marker ("report section", "log tail", …). Text under the limit comes
    back unchanged (the same object).
    """
    if len(text) * 4 <= limit:  # fast path: no UTF-8 character is longer than 4 bytes
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    limit = max(limit, _MIN_LIMIT)
    sep = "\n" if "\n" in text else " "
    # The real cut can be up to 3 bytes larger (a character split at a boundary is dropped): +8 covers
    # the extra digits and separator.
    room = max(0, limit - len(_marker(len(data), limit, what).encode()) - 2 * len(sep) - 8)
    head_n = {"head": room, "tail": 0, "both": room // 2}[keep]
    tail_n = room - head_n
    head = data[:head_n]
    if keep != "tail" and (nl := head.rfind(b"\n")) >= head_n - _SNAP and nl > 0:
        head = head[:nl]
    tail = data[len(data) - tail_n:] if tail_n else b""
    if keep != "head" and 0 <= (nl := tail.find(b"\n")) < _SNAP and nl < len(tail) - 1:
        tail = tail[nl + 1:]
    head_s = head.decode("utf-8", "ignore")
    tail_s = tail.decode("utf-8", "ignore")
    kept = len(head_s.encode("utf-8", "surrogatepass")) + len(tail_s.encode("utf-8", "surrogatepass"))
    marker = _marker(len(data) - kept, limit, what)
    parts = [p for p in (head_s, marker, tail_s) if p]
    return sep.join(parts)


def scrub(text: str, limit: int, what: str, *, keep: Keep = "both", extra: tuple[str, ...] = ()) -> str:
    """Redacted, made safe to print (scrub/terminal.py: no control character acts, no line is a CI workflow
    command), then capped: the one call for any text about to leave the process.

    Text far over the limit is cut loosely first (regexes over megabytes cost seconds) with a wide
    margin, so the final cut falls inside text that was redacted with its context.
    """
    margin = 4 * KB
    if len(text) > 4 * (limit + 2 * margin):
        text = cap(text, 4 * (limit + 2 * margin), what, keep=keep)
    safe = terminal_safe(redact(text, extra))
    out = cap(safe, limit, what, keep=keep)
    # A cut inside a line can start the kept tail with what was mid-line ("…x::error::y"); the few bytes the
    # escape adds fit the slack cap leaves under its limit.
    return out if out is safe else terminal_safe(out)


def bound_obj(value: Any, *, item: int, what: str, extra: tuple[str, ...] = ()) -> Any:
    """A JSON-like value with every string redacted and capped at `item` bytes and every list at
    MAX_ENTRIES entries (the count of the rest is stated in the last one). Dict values whose key names
    a secret (``AWS_SECRET_ACCESS_KEY``, ``api_key``…) are masked whatever they hold."""
    if isinstance(value, str):
        return scrub(value, item, what, extra=extra)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, inner in value.items():
            masked = redact_mapping_value(str(key), inner)
            out[key] = bound_obj(masked, item=item, what=what, extra=extra)
        return out
    if isinstance(value, list | tuple):
        entries = [bound_obj(v, item=item, what=what, extra=extra) for v in value[:MAX_ENTRIES]]
        if len(value) > MAX_ENTRIES:
            entries.append(f"[… {len(value) - MAX_ENTRIES:,} more entries cut: cap {MAX_ENTRIES} per list]")
        return entries
    return value


def failure_text(exc: BaseException) -> str:
    """The message of a service failure plus the end of its log, redacted and capped to fit a failure text."""
    text = scrub(str(exc), ITEM_BYTES // 2, "error message")
    tail = getattr(exc, "log_tail", "")
    if tail:
        lines = "\n".join(tail.strip().splitlines()[-LOG_TAIL_LINES:])
        room = LONGREPR_BYTES - nbytes(text) - 1024  # the rest of the failure text: where, type, "Failed: "
        text += "\n--- last lines of the service log ---\n" + scrub(lines, room, "log tail", keep="tail")
    return text
