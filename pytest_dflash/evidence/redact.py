"""Secret redaction for everything that can reach a report: logs, journals, messages, commands.

The patterns are deliberately broad (a false positive costs a few characters of evidence; a
false negative leaks a credential into a CI artefact).
"""

from __future__ import annotations

import re

MASK = "***REDACTED***"

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization headers and bearer tokens.
    (re.compile(r"(?i)(authorization\s*[:=]\s*)(bearer|basic|token)\s+[^\s'\",]+"), rf"\1\2 {MASK}"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    # Passwords in URLs: scheme://user:password@host
    (re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]+):[^@\s/'\"]+@"), rf"\1:{MASK}@"),
    # --api-key VALUE / --api-key=VALUE / --hf-token VALUE and friends on command lines.
    (
        re.compile(r"(?i)(--(?:api[-_]?key|admin[-_]?api[-_]?key|hf[-_]?token|token|password|secret)(?:=|\s+))"
                   r"(?:'[^']*'|\"[^\"]*\"|[^\s'\"]+)"),
        rf"\1{MASK}",
    ),
    # KEY=VALUE, KEY: VALUE, "key": "value" for secret-looking names (env files, unit Environment=, JSON).
    (
        re.compile(r"(?i)([\"']?(?<![\w#.-])(?![A-Z]*_?(?:eos|bos|pad|unk|mask|sep|cls)_token\b)[A-Z0-9_.-]*"
                   r"(?:api[_-]?key|token|secret|password|passwd|credentials?|bearer)\b[\"']?"
                   r"\s*[:=]\s*)(?:\"[^\"]*\"|'[^']*'|[^\s,;'\"}]+)"),
        rf"\1{MASK}",
    ),
    # Well-known token shapes, wherever they appear.
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), MASK),
    (re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{16,}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}\b"), MASK),
)


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """Mask secrets in `text`. `extra` are literal secret values known to this run (e.g. API keys)."""
    if not text:
        return text
    for secret in extra:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
