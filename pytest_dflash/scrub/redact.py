"""Secret redaction for everything that can reach a report: logs, journals, messages, commands, facts.

Two kinds of rules:

- Shapes that are secrets wherever they appear: bearer tokens, passwords in URLs, the user of an
  http(s)/ws(s) URL that has no password (``https://TOKEN@host``: a token, as git and proxies take it; an
  ssh user stays visible), a secret's value in a URL's query (``?key=``, ``&token=``, ``?access_token=``,
  ``?api_key=``, signed-URL signatures; numbers included), PEM private keys, and well-known key formats
  (Hugging Face ``hf_…``, OpenAI/Anthropic ``sk-…``, GitHub, Slack, AWS ``AKIA…``/``ASIA…``, Google
  ``AIza…``/``ya29.…``, JWTs, Stripe).
- A value next to a name that says it is secret, in each form a log writes it: ``--api-key V``,
  ``--api-key=V``, an argv list ``['--api-key', 'V']``, ``api_key='V'`` (SGLang's ServerArgs repr),
  ``AWS_SECRET_ACCESS_KEY=V``, ``"password": "V"``, ``Authorization: V``.

Names containing ``secret``, ``password``, ``api_key``, ``credential``, ``authorization``, ``*_key``
of a key kind are masked whatever the value. Names that merely END in ``token`` are masked only when
the value is a string: SGLang's ``max_prefill_tokens=16384``, ``bucket_time_to_first_token=None``,
``kt_max_deferred_experts_per_token=None`` are settings, not credentials, and stay visible. A value
that says there is no secret (``None``, ``''``, ``False``, ``$VAR``) is never masked, for any name:
``api_key=None`` is evidence ("the server ran without a key").
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

__all__ = ["MASK", "is_secret", "mask_query_secrets", "mask_url_passwords", "one_line", "redact",
           "redact_argv", "redact_mapping_value", "redact_url", "remember", "secret_kind"]

MASK = "***REDACTED***"

# Literal secret values known to this process (a profile's API key, the values of its command's secret
# flags): masked wherever they appear, whatever surrounds them.
_KNOWN: set[str] = set()
# Short texts redact the same way until `remember` learns a secret: a report's property repeats the same host
# names, URLs and phases on every test, and 13 patterns over each cost more than the rest of the report.
# Keyed by what the answer depends on (the text, the caller's secrets, the generation of _KNOWN).
_MEMO: dict[tuple[str, tuple[str, ...], int], str] = {}
_MEMO_TEXT = 512  # characters: longer texts (logs) are rarely repeated
_MEMO_ENTRIES = 8192
_generation = 0

_STRONG_NAME = re.compile(
    r"api[_-]?key|apikey|secret|passw(?:or)?d|credential|authorization|bearer|cookie|x-amz-security"
    r"|(?:private|access|account|signing|client|master|encryption|session|storage)[_-]?key"
    r"|(?:^|[_-])auth$|connection[_-]?string",
    re.IGNORECASE,
)
_TOKEN_NAME = re.compile(r"token$", re.IGNORECASE)
# Named tokens of a tokenizer (eos_token='<|im_end|>') and names of where a secret lives, not the secret.
_NOT_SECRET_NAME = re.compile(
    r"(?:eos|bos|pad|unk|mask|sep|cls|image|video|audio|start|end|think|special)[_-]?token$"
    r"|[_-](?:env|file|path|dir|var)$",
    re.IGNORECASE,
)
_NO_SECRET_VALUES = frozenset({"", "none", "null", "nil", "false", "true", "undefined", "unset", "no", "off",
                               "-", "<redacted>", "redacted", "***", "<hidden>", "[]", "{}"})
_AUTH_SCHEMES = frozenset({"bearer", "basic", "token", "digest"})
_NUMBER = re.compile(r"[\[(]?[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?", re.IGNORECASE)

# name + separator: `--flag ` / `--flag=`, `'--flag', ` in an argv list, `name=`, `name: `, `"name": `.
_ASSIGN = re.compile(
    r"""(?<![\w#.$/-])(?:
        (?P<q1>["'])(?P<argv>--?[A-Za-z][\w.-]*)(?P=q1)\s*,\s*(?=["'])
      | (?P<flag>--[A-Za-z][\w.-]*)(?:=|[ \t]+)
      | (?P<q2>["']?)(?P<name>[A-Za-z_][\w.-]*)(?P=q2)(?P<sep>[ \t]*[:=][ \t]*)
    )""",
    re.VERBOSE,
)
_VALUE = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[^\s,;'"})\]&]+""")

# Passwords in URLs: scheme://user:password@host (user may be empty: redis://:pw@host). The password runs to
# the LAST '@' before the host, as urllib reads it (ssh://root:p@ss@host: the password is 'p@ss').
# The lookbehind anchors the scheme: without it a long word is rescanned from every letter (quadratic).
_URL_PASSWORD = re.compile(r"((?<![a-zA-Z0-9+.-])[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]*):[^\s/'\"?#]+@")

# A token as the whole userinfo of an HTTP URL: http://TOKEN@host. Not ssh://root@host (a user name).
_URL_USER_TOKEN = re.compile(r"((?<![a-zA-Z0-9+.-])(?:https?|wss?)://)[^/\s:@'\"?#\[\]]+@", re.IGNORECASE)
# A query parameter (after ? or &) whose name says secret: its value masked, whatever it looks like (a URL
# carries no settings named *token whose numbers must stay visible).
_URL_QUERY = re.compile(r"([?&]([A-Za-z][\w.-]*)=)([^&\s'\"#<>]+)")
_QUERY_SECRET_NAMES = frozenset({"key", "sig", "signature", "code", "pass", "pwd", "auth"})

_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys (a GCP service-account JSON holds one), also with JSON-escaped newlines.
    (re.compile(r"(-----BEGIN ((?:[A-Z]+ )*PRIVATE KEY)-----).*?(?:-----END \2-----|\Z)", re.DOTALL),
     rf"\1{MASK}-----END \2-----"),
    # Authorization headers and bearer tokens.
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(bearer|basic|token|digest)\s+[^\s'\",;]+"),
     rf"\1\2 {MASK}"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    # Passwords in URLs, and a token as the user of an HTTP URL (above).
    (_URL_PASSWORD, rf"\1:{MASK}@"),
    (_URL_USER_TOKEN, rf"\1{MASK}@"),
    # Signed URLs: Azure SAS `sig=`, S3 / GCS presigned signatures and credentials.
    (re.compile(r"(?i)([?&](?:sig|signature|x-amz-signature|x-amz-credential|x-goog-signature|x-goog-credential)=)"
                r"[^&\s'\"]+"), rf"\1{MASK}"),
    # Well-known key formats, wherever they appear.
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), MASK),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"), MASK),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), MASK),
    (re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}"), MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), MASK),
    (re.compile(r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),  # JWT
)


def remember(*secrets: str | None) -> None:
    """Literal secrets of this run (4+ characters), masked in every later `redact` call."""
    global _generation
    new = {s for s in secrets if s and len(s) >= 4} - _KNOWN
    if new:
        _KNOWN.update(new)
        _generation += 1  # before the clear: an answer computed without the new secret is never read again
        _MEMO.clear()


# a pure function of a name; reports ask it for the same keys again and again
@functools.lru_cache(maxsize=4096)
def secret_kind(name: str) -> str | None:
    """'secret' (mask any value), 'token' (mask string values only) or None (not a secret's name)."""
    name = name.strip("'\"-")
    if _NOT_SECRET_NAME.search(name):
        return None
    if _STRONG_NAME.search(name):
        return "secret"
    if _TOKEN_NAME.search(name):
        return "token"
    return None


def _says_no_secret(value: str, kind: str) -> bool:
    bare = value.strip("'\"").strip()
    if bare.lower() in _NO_SECRET_VALUES or MASK in bare:
        return True
    if bare.startswith(("$", "{")) or bare.lower() in _AUTH_SCHEMES:
        return True  # a reference ($HF_TOKEN, {api_key}); an auth scheme whose credential a shape rule masks
    if kind == "token":
        # token counts and limits, and a tokenizer's special tokens ('<|im_end|>')
        return bool(_NUMBER.fullmatch(bare)) or (bare.startswith("<") and bare.endswith(">"))
    return False


def is_secret(name: str, value: str) -> bool:
    """Would `name=value` be masked? (`--api-key K`: yes; `--max-prefill-tokens 16384`, `api_key=None`:
    no.)"""
    kind = secret_kind(name)
    return kind is not None and not _says_no_secret(value, kind)


def _mask_assignments(text: str) -> str:
    out: list[str] = []
    last = 0
    for match in _ASSIGN.finditer(text):
        if match.start() < last:
            continue
        kind = secret_kind(match.group("argv") or match.group("flag") or match.group("name"))
        if kind is None:
            continue
        sep = match.group("sep") or ""
        if sep.startswith("=") and sep != sep.rstrip():
            continue  # `HF_TOKEN= NEXT=…`: an empty value, as a shell or an env dump writes it
        value = _VALUE.match(text, match.end())
        if value is None or _says_no_secret(value.group(), kind):
            continue
        raw = value.group()
        quote = raw[0] if raw[0] in "'\"" and len(raw) > 1 and raw[-1] == raw[0] else ""
        out += [text[last:value.start()], f"{quote}{MASK}{quote}"]
        last = value.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """Mask secrets in `text`. `extra` are literal secret values known to the caller (e.g. API keys)."""
    if not text:
        return text
    if len(text) > _MEMO_TEXT:
        return _redact(text, extra)
    key = (text, extra, _generation)
    done = _MEMO.get(key)
    if done is None:
        done = _redact(text, extra)
        if len(_MEMO) >= _MEMO_ENTRIES:
            _MEMO.clear()
        _MEMO[key] = done
    return done


def _redact(text: str, extra: tuple[str, ...]) -> str:
    for secret in (*extra, *_KNOWN):
        if secret and len(secret) >= 4 and secret in text:
            text = text.replace(secret, MASK)
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return _mask_assignments(mask_query_secrets(text))


def _query_value(match: re.Match[str]) -> str:
    name, value = match.group(2), match.group(3)
    secret = name.lower() in _QUERY_SECRET_NAMES or secret_kind(name) is not None
    return f"{match.group(1)}{MASK}" if secret and MASK not in value else match.group()


def mask_query_secrets(text: str) -> str:
    """The value of every URL query parameter in `text` whose name says secret (`?key=`, `&token=`,
    `?access_token=`, `?api_key=`, `&sig=`) masked, numbers included."""
    return _URL_QUERY.sub(_query_value, text) if ("?" in text or "&" in text) else text


def redact_url(url: str) -> str:
    """A URL as it may be shown (a report header, `pytest-dflash check`, a progress line, an error): its
    password masked (urllib's reading of the userinfo, so a password holding '@' or a quote is masked whole),
    then the rest of `redact` (signed-URL signatures, `?api_key=` in the query). Not a URL, or a malformed
    one: `redact`."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return redact(url)
    if password:
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hostport}"))
    return redact(url)


# A command-line flag whose name ENDS in one of these words (`--api-key`, `--admin-api-key`, `--hf-token`,
# `--watermark-key`, `--ssl-keyfile-password`): its value is a secret. The last word, not any substring:
# sglang 0.5.23's `--tokenizer-path`, `--ssl-keyfile`, `--speculative-token-map` name paths and
# `--max-prefill-tokens`, `--bucket-inter-token-latency` numbers (tests/data/sglang-versions/
# secretish-flags-0.5.23.toml lists all 33 of its flags that hold key / token / secret / password).
_SECRET_FLAG_ENDS = frozenset({"key", "keys", "apikey", "token", "secret", "secrets", "password", "passwd",
                               "credential", "credentials"})


def _secret_flag(flag: str) -> bool:
    return flag.startswith("-") and re.split(r"[-_.]+", flag.lstrip("-").lower())[-1] in _SECRET_FLAG_ENDS


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line as it may be shown: the value of every flag whose name says secret (`--api-key K`,
    `--api-key=K`, `--admin-api-key K`, `--hf-token T`, any `*-key` / `*-token` / `*-secret` / `*-password`
    flag) masked, unless it says there is none (a number, `None`, SGLang's own `<redacted>`); then every
    token through `redact` (URL passwords, key shapes, the run's known secrets)."""
    out: list[str] = []
    secret_next = False
    for token in argv:
        if secret_next and not token.startswith("--"):
            secret_next = False
            if not _says_no_secret(token, "token"):
                out.append(MASK)
                continue
        secret_next = False
        flag, eq, value = token.partition("=")
        if _secret_flag(flag):
            if not eq:
                secret_next = True
            elif not _says_no_secret(value, "token"):
                token = f"{flag}={MASK}"
        out.append(redact(token))
    return out


def mask_url_passwords(text: str) -> str:
    """Only the credentials of the URLs in `text` masked (passwords, a token as an HTTP URL's user, secrets in
    a query): for messages about input (a usage error quoting a profile's value), where `redact`'s name rules
    would mask words ('host.password: unknown key')."""
    return mask_query_secrets(_URL_USER_TOKEN.sub(rf"\1{MASK}@", _URL_PASSWORD.sub(rf"\1:{MASK}@", text)))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` on one line: control characters (newlines, tabs, escapes, NUL) written as Python escapes, so an
    error that quotes bad input (a host name with a newline, a TOML key with an escape) stays one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def redact_mapping_value(key: str, value: Any) -> Any:
    """The value of `key` in a dict (a fact, an environment snapshot), masked when the key names a secret."""
    kind = secret_kind(key)
    if kind is None or value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return MASK if not _says_no_secret(value, kind) else value
    if kind == "secret" and isinstance(value, int | float):
        return MASK
    return value
