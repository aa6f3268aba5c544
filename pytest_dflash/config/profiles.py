"""Host profiles: TOML files that say how to reach a host and which DFlash services it serves.

A profile is validated completely at load time. Every problem becomes one `InventoryError`
that names the file, the dotted key and what was expected, e.g.

    hosts/ct200.toml: services.dflash.url: expected an http(s) URL, got 'htp:/x'

One module over 600 lines on purpose: it is the one validator of the profile format (every table and key,
[host], [services.*] of each kind, [parity], [perf], [floors.*]), which config/schema.py and `pytest-dflash
check` follow; tests/config/test_schema.py holds the two in step.
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
import unicodedata
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pytest_dflash.config.durations import MAX_TEXT, DurationError, parse_seconds
from pytest_dflash.errors import InventoryError
from pytest_dflash.scrub.redact import mask_url_passwords, one_line, redact_url

ALGORITHMS = ("NONE", "DFLASH", "DDTREE", "EAGLE", "EAGLE3", "NGRAM", "STANDALONE")
# An external service whose profile names no algorithm: read from its /server_info before tests are selected
# (run/discovery.py); while unknown, only tests that do not depend on the algorithm select it.
AUTO = "AUTO"
SERVICE_KINDS = ("systemd", "process", "external", "container")
CONTAINER_ENGINES = ("docker", "podman")
# The container keys of a [services.NAME] table with kind = "container" (docs/profiles.md).
CONTAINER_KEYS = ("engine", "runtime", "container", "label", "image", "args", "devices", "mounts", "network",
                  "ipc", "shm_size", "restart", "memory", "ulimits", "run_args", "stop_timeout")
PROVISION_MODES = ("never", "allowed", "always")
FLOOR_KEYS = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "accept_length", "speedup_vs", "speedup")
FLOOR_SETTINGS = ("regression_pct", "confidence")
# Cold-start budgets in seconds (layers/service/coldstart.py): the whole cold start (the wait until the first
# sampled answer), or one phase of it, named for the phase's end (services/phases.py PHASE_NAMES): e.g.
# `cuda_graphs_captured_s = 120` = from the KV cache allocated to the CUDA graphs captured at most 120 s.
COLD_START_FLOORS = ("cold_start_s", "process_started_s", "weights_loaded_s", "kv_cache_allocated_s",
                     "cuda_graphs_captured_s", "port_open_s", "first_greedy_s", "first_sampled_s")
FLOOR_KEYS: tuple[str, ...] = (*FLOOR_KEYS, *COLD_START_FLOORS)  # type: ignore[no-redef]
# Any latency ceiling load.py measures per request: ttft_p50_ms, itl_p99_ms, tpot_mean_ms, e2e_p90_ms, ...
LATENCY_FLOOR = re.compile(r"^(ttft|itl|tpot|e2e)_(mean|median|p(\d+(?:\.\d+)?))_ms$")
PERF_ENDPOINTS = ("auto", "generate", "chat", "completions")
PERF_SERVICE_KEYS = ("requests", "duration", "warmup")
DEFAULT_CONNECT_TIMEOUT_S = 4.0
# [host] become_user: a POSIX-ish user name (what `sudo -u` takes), never an option or a shell word
BECOME_USER = r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"
BUILTIN_PROFILES = Path(__file__).parent / "builtin"

ProvisionMode = Literal["never", "allowed", "always"]
ServiceKind = Literal["systemd", "process", "external", "container"]
T = TypeVar("T")


@dataclass(frozen=True)
class ContainerSpec:
    """How a kind = "container" service is found (attach) or run (--provision) by docker / podman."""

    engine: str = "docker"
    runtime: str | None = None  # OCI runtime (podman: a global flag; docker: `run --runtime`)
    name: str | None = None  # attach to / provision under this container name
    label: str | None = None  # attach: the one container carrying this "key=value" label
    image: str | None = None
    args: tuple[str, ...] = ()  # appended after `command` (keep the image's entrypoint, give it args)
    gpus: str | None = None  # "all" or "device=0,1" (`--gpus`); from the service's gpus list when numbers
    devices: tuple[str, ...] = ()  # `--device`, e.g. CDI names "nvidia.com/gpu=all"
    mounts: tuple[str, ...] = ()  # `-v SRC:DST[:ro]`
    network: str | None = None
    ipc: str | None = None
    shm_size: str | None = None
    restart: str | None = None  # no | on-failure[:N] | always | unless-stopped
    memory: str | None = None
    ulimits: tuple[str, ...] = ()  # `--ulimit nofile=1024:1024`
    run_args: tuple[str, ...] = ()  # any other `run` options, as written
    stop_timeout_s: float = 30.0


@dataclass(frozen=True)
class ServiceSpec:
    """One inference service on a host: how to reach it and, optionally, how to start it."""

    name: str
    kind: ServiceKind
    url: str  # may contain {port} until a port is allocated
    algorithm: str
    unit: str | None = None
    template: Path | None = None
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    vars: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    port: int | None = None  # None with "{port}" in url/command = allocate a free one
    ready_timeout_s: float = 900.0
    sampled_timeout_s: float = 300.0
    api_key_env: str | None = None
    model: str | None = None
    discovery_error: str | None = None  # AUTO that could not be resolved: why (the service layer fails with it)
    container: ContainerSpec | None = None  # kind = "container"
    log_command: str | None = None  # kind = "external": a command printing its log ({since}: unix time)
    log_file: str | None = None  # kind = "external": a log file on the host
    # A draft that knowingly cannot be accepted (a random-weight test draft): why. Lowers the default accept-length
    # minimum (1.1) to 1 token per verify step (layers/parity/acceptance.py).
    unaccepted_draft: str | None = None

    @property
    def speculative(self) -> bool:
        return self.algorithm not in ("NONE", AUTO)

    @property
    def display_url(self) -> str:
        """The URL as every line the plugin prints or writes shows it: a password in it masked."""
        return redact_url(self.url)

    def url_on(self, port: int | None) -> str:
        """The service's URL with `{port}` filled in (left empty while no port is known)."""
        return self.url.replace("{port}", str(port or ""))


@dataclass(frozen=True)
class ParitySpec:
    """Which service is the reference for losslessness checks, and which are compared to it."""

    reference: str
    compare: tuple[str, ...]
    plain: str | None = None  # a non-speculative service to read top logprobs from (tie triage)
    tie_gap: float = 1e-3  # top-1/top-2 logprob gap below which a divergence is a numerical tie
    max_tie_rate: float = 0.25  # fraction of prompts allowed to diverge at ties
    # A divergence within this many nats of the top logprob, where the compared service itself gives the
    # reference's token when the prompt is sent again alone, is numerical noise (seen on an H200 in bf16: one
    # step, 0.25 nats, on DFLASH's first request for a prompt and inside a batch), not a lossy verifier.
    noise_gap: float = 0.5
    prompts: Path | None = None


@dataclass(frozen=True)
class HostProfile:
    """A validated host profile."""

    name: str
    source: Path
    connection: str | None  # "local://", "ssh://user@host:port?timeout=4", or None (attach by URL)
    python: str
    services: Mapping[str, ServiceSpec]
    gpus: tuple[int, ...] = ()
    provision: ProvisionMode = "allowed"
    ssh_config: str | None = None
    ssh_identity_file: str | None = None
    cuda_home: str | None = None
    command_timeout_s: float = 30.0
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    parity: ParitySpec | None = None
    floors: Mapping[str, Mapping[str, float | str]] = field(default_factory=dict)
    perf: Mapping[str, Any] = field(default_factory=dict)
    # [host] become = true: commands that need root run through `sudo -n -u <become_user>` (transport.py)
    become: bool = False
    become_user: str = "root"

    @property
    def is_local(self) -> bool:
        return self.connection is not None and self.connection.startswith("local://")

    @property
    def display_connection(self) -> str | None:
        """The connection as every line the plugin prints or writes shows it (report header, `check`, the
        verdict's `connection`): a password in it masked. `connection` itself is what ssh is given."""
        return None if self.connection is None else redact_url(self.connection)

    @property
    def address(self) -> str | None:
        """The network name of the host, for service URLs (None for local/attach)."""
        if not self.connection or self.is_local:
            return None
        return urllib.parse.urlparse(self.connection).hostname


class _Table:
    """A TOML table being consumed key by key; leftovers are reported as unknown keys."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str) -> None:
        self._data, self._source, self._prefix = dict(data), source, prefix
        self._seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self._prefix}.{name}" if self._prefix else name

    def fail(self, name: str, expected: str) -> InventoryError:
        return InventoryError(self._source, self.key(name), expected)

    def get(self, name: str, kind: type[T], default: T | None = None, *, required: bool = False) -> T | None:
        self._seen.add(name)
        if name not in self._data:
            if required:
                raise self.fail(name, f"missing required key (expected {_type_name(kind)})")
            return default
        value = self._data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.fail(name, f"expected {_type_name(kind)}, got {_describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(name, f"expected a finite number, got {value!r}")
        return value

    def raw(self, name: str) -> Any:
        """The value as written (None when absent), with no type check."""
        self._seen.add(name)
        return self._data.get(name)

    def str_list(self, name: str) -> tuple[str, ...]:
        items = self.get(name, list, [])
        assert items is not None
        if not all(isinstance(item, str) for item in items):
            raise self.fail(name, "expected a list of strings")
        return tuple(items)

    def int_list(self, name: str) -> tuple[int, ...]:
        items = self.get(name, list, [])
        assert items is not None
        if not all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in items):
            raise self.fail(name, "expected a list of GPU indices (non-negative integers)")
        return tuple(items)

    def str_map(self, name: str) -> dict[str, str]:
        table = self.get(name, dict, {})
        assert table is not None
        out: dict[str, str] = {}
        for key, value in table.items():
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise self.fail(f"{name}.{key}", f"expected a string or number, got {_describe(value)}")
            out[key] = str(value)
        return out

    def duration(self, name: str, default: float) -> float:
        raw = self.raw(name)
        if raw is None:
            return default
        if not isinstance(raw, str | int | float) or isinstance(raw, bool):
            raise self.fail(name, f"expected a duration like 90, '90s' or '15m', got {_describe(raw)}")
        try:
            return parse_seconds(raw, where=self.key(name))
        except DurationError as exc:
            if exc.problem == "too long":
                raise self.fail(name, f"expected a duration of at most {MAX_TEXT}, got {raw!r}") from None
            raise self.fail(name, f"expected a duration like 90, '90s' or '15m', got {raw!r}") from None

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
        value = self.get(name, str, default)
        if value is not None and value not in choices:
            raise self.fail(name, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def sub(self, name: str, *, required: bool = False) -> _Table | None:
        data = self.get(name, dict, None, required=required)
        return None if data is None else _Table(data, self._source, self.key(name))

    def items(self) -> list[tuple[str, Any]]:
        return list(self._data.items())

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise self.fail(unknown[0], "unknown key" + _did_you_mean(unknown[0], self._seen))


def _type_name(kind: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            list: "a list", dict: "a table"}.get(kind, kind.__name__)


def _describe(value: object) -> str:
    kind = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:40]}" if len(text) <= 40 else f"{kind} {text[:37]}..."


def _did_you_mean(name: str, known: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render(template: str, values: Mapping[str, str], *, where: str) -> str:
    """Replace {name} placeholders; systemd's own ${VAR} is left alone. Unknown names are errors."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"{where}: unknown placeholder {{{name}}} (known: {', '.join(sorted(values))})")
        return values[name]

    return _PLACEHOLDER.sub(one, template)


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))


def _parse(table: _Table, name: str, raw: str, expected: str) -> urllib.parse.ParseResult:
    """urlparse, with a malformed host (an IPv6 address missing its ']', or not an address at all: urllib's
    ValueError) as the table's one-line error. The value is shown with its password masked."""
    try:
        return urllib.parse.urlparse(raw)
    except ValueError as exc:
        raise table.fail(name, f"expected {expected}, got {redact_url(raw)!r} (malformed host: {exc}; an IPv6 "
                               "address is written in brackets, e.g. [fd00::1])") from None


def _url_host(address: str) -> str:
    """A host name or address as it goes into a URL: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _check_url(table: _Table, name: str, url: str) -> str:
    probe = url.replace("{port}", "1").replace("{address}", "host")
    expected = "an http(s) URL"
    parsed = _parse(table, name, probe, expected)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise table.fail(name, f"expected {expected}, got {redact_url(url)!r}")
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise table.fail(name, f"expected an http(s) URL with a numeric port, got {redact_url(url)!r}") from None
    return url.rstrip("/")


def _check_connection(table: _Table, raw: str) -> tuple[str, float]:
    expected = "local:// or ssh://[user@]host[:port][?timeout=N]"
    parsed = _parse(table, "connection", raw, expected)
    if parsed.scheme == "local":
        return "local://", DEFAULT_CONNECT_TIMEOUT_S
    if parsed.scheme not in ("ssh", "paramiko", "safe-ssh"):
        raise table.fail("connection", f"expected {expected}, got {redact_url(raw)!r}")
    if not parsed.hostname:
        raise table.fail("connection", f"expected a host name in {redact_url(raw)!r}")
    try:
        parsed.port  # noqa: B018
    except ValueError:
        raise table.fail("connection", f"expected a numeric ssh port in {redact_url(raw)!r}") from None
    query = urllib.parse.parse_qs(parsed.query)
    timeout = DEFAULT_CONNECT_TIMEOUT_S
    if "timeout" in query:
        try:
            timeout = float(query["timeout"][0])
        except ValueError:
            raise table.fail("connection", f"expected ?timeout=<seconds>, got {query['timeout'][0]!r}") from None
        if not 0 < timeout <= 5:
            raise table.fail("connection", f"connect timeout must be in (0, 5] seconds, got {timeout:g}")
    else:
        sep = "&" if parsed.query else "?"
        raw = f"{raw}{sep}timeout={timeout:g}"
    return raw, timeout


def _service(name: str, table: _Table, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    kind = table.choice("kind", SERVICE_KINDS, "systemd" if host.connection and not host.is_local else "process")
    assert kind is not None
    algorithm = table.get("algorithm", str, required=kind != "external") or AUTO
    if algorithm.upper() not in ALGORITHMS and not (kind == "external" and algorithm.upper() == AUTO):
        allowed = ", ".join(ALGORITHMS) + (" (or auto: read from /server_info)" if kind == "external" else "")
        raise table.fail("algorithm", f"expected one of {allowed}, got {algorithm!r}")
    unit = table.get("unit", str)
    template_raw = table.get("template", str)
    command = table.str_list("command")
    port = table.raw("port")
    if port == "auto" or port is None:
        port_value = None
    elif isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
        port_value = port
    else:
        raise table.fail("port", f'expected a TCP port number or "auto", got {_describe(port)}')
    default_url = None
    if host.address:
        default_url = f"http://{_url_host(host.address)}:{port_value or '{port}'}"
    elif host.is_local:
        default_url = f"http://127.0.0.1:{port_value or '{port}'}"
    url = table.get("url", str, default_url)
    if url is None:
        raise table.fail("url", "missing required key (expected an http(s) URL)")
    url = _check_url(table, "url", url)
    if "{address}" in url:
        # Fleet profiles share one file: the URL follows the host's address.
        if not (host.address or host.is_local):
            raise table.fail("url", "{address} needs an ssh:// or local:// connection")
        url = url.replace("{address}", _url_host(host.address) if host.address else "127.0.0.1")
    if kind == "systemd":
        if not unit:
            raise table.fail("unit", "missing required key for kind = \"systemd\" (expected a unit name)")
        if not unit.endswith(".service") or "/" in unit:
            raise table.fail("unit", f"expected a unit name like 'sglang-dflash.service', got {unit!r}")
        if host.is_local and host.connection:
            pass  # a local systemd is allowed (the controller runs on the GPU host itself)
    if kind == "process":
        if not command:
            raise table.fail("command", 'missing required key for kind = "process" (expected a list of strings)')
        if host.connection and not host.is_local:
            raise table.fail("kind", 'kind = "process" runs on this machine; use "systemd" for a remote host')
    template = None
    if template_raw:
        template = (profile_dir / template_raw).resolve()
        if not template.is_file():
            raise table.fail("template", f"expected a unit template file, {template} does not exist")
    container = _container(table, kind) if kind == "container" else None
    gpus = () if container is not None and table.raw("gpus") == "all" else table.int_list("gpus")
    if container is not None and gpus:
        container = replace(container, gpus="device=" + ",".join(str(g) for g in gpus))
    log_command = table.get("log_command", str)
    log_file = table.get("log_file", str)
    if (log_command or log_file) and kind != "external":
        key = "log_command" if log_command else "log_file"
        raise table.fail(key, f'only for kind = "external" (a {kind} service has its own log)')
    if log_command and log_file:
        raise table.fail("log_file", "give log_command or log_file, not both")
    if log_file and not log_file.startswith("/"):
        raise table.fail("log_file", f"expected an absolute path on the host, got {log_file!r}")
    if (log_command or log_file) and host.connection is None:
        raise table.fail("log_command" if log_command else "log_file", "needs host access (a connection)")
    unaccepted_draft = table.get("unaccepted_draft", str)
    if unaccepted_draft is not None and algorithm.upper() in ("NONE", AUTO):
        raise table.fail("unaccepted_draft", "only for a service with a speculative algorithm (this one has "
                                             f"{'none' if algorithm.upper() == 'NONE' else 'no algorithm given'})")
    if unaccepted_draft is not None and not unaccepted_draft.strip():
        raise table.fail("unaccepted_draft", "expected the reason why this service's draft cannot be accepted "
                                             "(a non-empty string)")
    needs_port = any("{port}" in part for part in (url, *command))
    if port_value is None and needs_port and kind != "process":
        raise table.fail("port", "expected a fixed port: only process services get an automatic one")
    spec = ServiceSpec(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        url=url,
        algorithm=algorithm.upper(),
        unit=unit,
        template=template,
        command=command,
        env=table.str_map("env"),
        vars=table.str_map("vars"),
        gpus=gpus,
        port=port_value,
        ready_timeout_s=table.duration("ready_timeout", 900.0),
        sampled_timeout_s=table.duration("sampled_timeout", 300.0),
        api_key_env=table.get("api_key_env", str),
        model=table.get("model", str),
        container=container,
        log_command=log_command,
        log_file=log_file,
        unaccepted_draft=unaccepted_draft,
    )
    table.done()
    return spec


def _container(table: _Table, kind: str) -> ContainerSpec:
    """The container keys of a kind = "container" service (the other kinds reject them as unknown keys)."""
    engine = table.choice("engine", CONTAINER_ENGINES, "docker")
    name = table.get("container", str)
    label = table.get("label", str)
    if label is not None and not re.fullmatch(r"[A-Za-z0-9_.\-/]+=\S*", label):
        raise table.fail("label", f'expected "key=value", got {label!r}')
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise table.fail("container", f"expected a container name ([A-Za-z0-9][A-Za-z0-9_.-]*), got {name!r}")
    restart = table.get("restart", str)
    if restart is not None and not re.fullmatch(r"no|always|unless-stopped|on-failure(:\d+)?", restart):
        raise table.fail("restart", f"expected no, on-failure[:N], always or unless-stopped, got {restart!r}")
    ulimits = table.str_list("ulimits")
    for item in ulimits:
        if not re.fullmatch(r"[a-z]+=-?\d+(:-?\d+)?", item):
            raise table.fail("ulimits", f'expected items like "nofile=1024:1024", got {item!r}')
    mounts = table.str_list("mounts")
    for item in mounts:
        if ":" not in item:
            raise table.fail("mounts", f'expected items like "/host/dir:/container/dir[:ro]", got {item!r}')
    return ContainerSpec(
        engine=engine or "docker",
        runtime=table.get("runtime", str),
        name=name,
        label=label,
        image=table.get("image", str),
        args=table.str_list("args"),
        gpus="all" if table.raw("gpus") == "all" else None,
        devices=table.str_list("devices"),
        mounts=mounts,
        network=table.get("network", str),
        ipc=table.get("ipc", str),
        shm_size=table.get("shm_size", str),
        restart=restart,
        memory=table.get("memory", str),
        ulimits=ulimits,
        run_args=table.str_list("run_args"),
        stop_timeout_s=table.duration("stop_timeout", 30.0),
    )


def _parity(table: _Table, services: Mapping[str, ServiceSpec], profile_dir: Path) -> ParitySpec:
    reference = table.get("reference", str, required=True)
    assert reference is not None
    compare = table.str_list("compare")
    plain = table.get("plain", str)
    for key, name in [("reference", reference), ("plain", plain), *(("compare", c) for c in compare)]:
        if name is not None and name not in services:
            raise table.fail(key, f"expected a service of this host ({', '.join(services)}), got {name!r}")
    if not compare:
        compare = tuple(name for name in services if name != reference)
    prompts = table.get("prompts", str)
    tie_gap = table.get("tie_gap", float, 1e-3)
    max_tie_rate = table.get("max_tie_rate", float, 0.25)
    noise_gap = table.get("noise_gap", float, 0.5)
    assert tie_gap is not None and max_tie_rate is not None and noise_gap is not None
    if noise_gap < 0:
        raise table.fail("noise_gap", f"expected a non-negative logprob gap, got {noise_gap}")
    if not 0 <= max_tie_rate <= 1:
        raise table.fail("max_tie_rate", f"expected a fraction in [0, 1], got {max_tie_rate}")
    spec = ParitySpec(
        reference=reference,
        compare=compare,
        plain=plain,
        tie_gap=tie_gap,
        max_tie_rate=max_tie_rate,
        noise_gap=noise_gap,
        prompts=(profile_dir / prompts).resolve() if prompts else None,
    )
    table.done()
    return spec


def _floors(table: _Table, services: Mapping[str, ServiceSpec]) -> dict[str, dict[str, float | str]]:
    """[floors.SERVICE]: thresholds judged by the perf layer (docs/perf.md), validated and normalised."""
    floors: dict[str, dict[str, float | str]] = {}
    for service, _ in table.items():
        if service not in services:
            raise table.fail(service, f"expected a service of this host ({', '.join(services)})")
        sub = table.sub(service)
        assert sub is not None
        values: dict[str, float | str] = {}
        for key, value in sub.items():
            latency = LATENCY_FLOOR.match(key)
            if key not in (*FLOOR_KEYS, *FLOOR_SETTINGS) and latency is None:
                raise sub.fail(key, "unknown floor" + _did_you_mean(key, {*FLOOR_KEYS, *FLOOR_SETTINGS}))
            if key == "speedup_vs":
                if not isinstance(value, str) or value not in services or value == service:
                    others = ", ".join(name for name in services if name != service) or "none"
                    raise sub.fail(key, f"expected the name of another service of this host ({others}), "
                                        f"got {_describe(value)}")
                values[key] = value
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise sub.fail(key, f"expected a positive number, got {_describe(value)}")
            if key == "confidence" and not 0.5 < value < 1:
                raise sub.fail(key, f"expected a confidence level in (0.5, 1) such as 0.95, got {value!r}")
            if key == "regression_pct" and not value < 100:
                raise sub.fail(key, f"expected a percentage in (0, 100), got {value!r}")
            if latency is not None and latency.group(3) is not None and not 0 < float(latency.group(3)) < 100:
                raise sub.fail(key, "unknown floor: a percentile must be in (0, 100), e.g. ttft_p99_ms")
            values[key] = float(value)
        if ("speedup" in values) != ("speedup_vs" in values):
            missing = "speedup_vs" if "speedup" in values else "speedup"
            raise sub.fail(missing, "missing required key: speedup and speedup_vs go together "
                                    "(speedup_vs = \"none\", speedup = 2.0)")
        floors[service] = values
    return floors


def _perf(table: _Table, services: Mapping[str, ServiceSpec], profile_dir: Path | None = None) -> dict[str, Any]:
    """[perf]: how the perf layer loads each service; [perf.SERVICE] overrides requests/duration/warmup.

    Values are normalised: durations in seconds (float), per-service tables under "services", `dataset` an
    absolute path (relative to the profile file; "builtin": the shipped prompt set), read and checked here.
    """

    def dataset(name: str) -> str | None:
        value = table.get(name, str)
        if value is None:
            return None
        from pytest_dflash.load.workload import BUILTIN_NAME, DatasetError, dataset_path, load_dataset

        path = dataset_path(value) if value == BUILTIN_NAME else (profile_dir or Path.cwd()) / Path(value).expanduser()
        try:
            load_dataset(path)
        except DatasetError as exc:
            raise table.fail(name, str(exc)) from None
        return str(path.resolve())

    def count(sub: _Table, name: str, low: int) -> int | None:
        value = sub.get(name, int)
        if value is not None and value < low:
            raise sub.fail(name, f"expected an integer >= {low}, got {value}")
        return value

    def number(sub: _Table, name: str, *, positive: bool = True) -> float | None:
        value = sub.get(name, float)
        if value is not None and (value < 0 or (positive and value == 0)):
            raise sub.fail(name, f"expected a {'positive' if positive else 'non-negative'} number, got {value!r}")
        return value

    def duration(sub: _Table, name: str) -> float | None:
        value = sub.duration(name, -1.0)
        if value == -1.0:
            return None
        if not value > 0:
            raise sub.fail(name, f"expected a positive duration like '30s', got {sub.raw(name)!r}")
        return value

    out: dict[str, Any] = {}
    per_service: dict[str, dict[str, Any]] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            if key not in services:
                raise table.fail(key, f"expected a service of this host ({', '.join(services)}) or a [perf] key")
            sub = table.sub(key)
            assert sub is not None
            entry = {"requests": count(sub, "requests", 1), "duration": duration(sub, "duration"),
                     "warmup": count(sub, "warmup", 0)}
            sub.done()
            per_service[key] = {k: v for k, v in entry.items() if v is not None}
    endpoint = table.choice("endpoint", PERF_ENDPOINTS)
    values = {
        "endpoint": endpoint,
        "concurrency": count(table, "concurrency", 1),
        "requests": count(table, "requests", 1),
        "duration": duration(table, "duration"),
        "warmup": count(table, "warmup", 0),
        "prompt_len": count(table, "prompt_len", 1),
        "output_len": count(table, "output_len", 1),
        "temperature": number(table, "temperature", positive=False),
        "seed": count(table, "seed", 0),
        "request_timeout": duration(table, "request_timeout"),
        "max_loop_lag_ms": number(table, "max_loop_lag_ms"),
        "max_client_cpu": number(table, "max_client_cpu"),
        "retries": count(table, "retries", 0),
        "client_procs": count(table, "client_procs", 1),
        "dataset": dataset("dataset"),
    }
    for name in per_service:
        table.get(name, dict)  # seen
    table.done()
    out.update({k: v for k, v in values.items() if v is not None})
    if per_service:
        out["services"] = per_service
    return out


def load_profile(path: Path, *, name: str | None = None) -> HostProfile:
    """Read and validate one host profile file."""
    source = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InventoryError(source, "", f"cannot read profile: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(source, "", not_utf8(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(source, "", f"not valid TOML: {exc}") from None
    return profile_from_dict(data, source=path, name=name)


def error_line(exc: InventoryError) -> str:
    """The one line a bad profile, inventory or --attach URL is reported as (pytest's usage error, `pytest-dflash
    check`): control characters escaped (a key or name holding a newline stays one line), URL passwords masked."""
    return one_line(mask_url_passwords(str(exc)))


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What a file that is not UTF-8 text is told (TOML, and the inventories, are UTF-8)."""
    line = exc.object[:exc.start].count(b"\n") + 1
    return (f"expected UTF-8 text, got byte 0x{exc.object[exc.start]:02x} at line {line} (offset {exc.start}): "
            "save the file as UTF-8")


def profile_from_dict(data: Mapping[str, Any], *, source: Path, name: str | None = None) -> HostProfile:
    """Validate an already-parsed profile (TOML, or a fleet inventory entry)."""
    root = _Table(data, str(source), "")
    host = root.sub("host", required=True)
    assert host is not None
    connection_raw = host.get("connection", str, required=True)
    assert connection_raw is not None
    connection, connect_timeout = _check_connection(host, connection_raw)
    python = host.get("python", str, "python3")
    assert python is not None
    if python == "auto":
        python = sys.executable
    provision = host.choice("provision", PROVISION_MODES, "allowed")
    profile = HostProfile(
        name=_host_name(host, name or source.stem),
        source=source,
        connection=connection,
        python=python,
        services={},
        gpus=host.int_list("gpus"),
        provision=provision,  # type: ignore[arg-type]
        ssh_config=host.get("ssh_config", str),
        ssh_identity_file=host.get("ssh_identity_file", str),
        cuda_home=host.get("cuda_home", str),
        command_timeout_s=host.duration("command_timeout", 30.0),
        connect_timeout_s=connect_timeout,
        become=bool(host.get("become", bool, False)),
        become_user=_become_user(host),
    )
    host.done()
    services_table = root.sub("services", required=True)
    assert services_table is not None
    services: dict[str, ServiceSpec] = {}
    for service_name, value in services_table.items():
        if not isinstance(value, dict):
            raise services_table.fail(service_name, f"expected a table [services.{service_name}]")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", service_name):
            raise services_table.fail(service_name, "service names may use letters, digits, '_', '-', '.'")
        sub = services_table.sub(service_name)
        assert sub is not None
        services[service_name] = _service(service_name, sub, profile, source.parent)
    if not services:
        raise services_table.fail("", "expected at least one [services.NAME] table")
    parity_table = root.sub("parity")
    floors_table = root.sub("floors")
    perf_table = root.sub("perf")
    root.done()
    return HostProfile(
        name=profile.name,
        source=profile.source,
        connection=profile.connection,
        python=profile.python,
        services=services,
        gpus=profile.gpus,
        provision=profile.provision,
        ssh_config=profile.ssh_config,
        ssh_identity_file=profile.ssh_identity_file,
        cuda_home=profile.cuda_home,
        command_timeout_s=profile.command_timeout_s,
        connect_timeout_s=profile.connect_timeout_s,
        become=profile.become,
        become_user=profile.become_user,
        parity=_parity(parity_table, services, source.parent) if parity_table else None,
        floors=_floors(floors_table, services) if floors_table else {},
        perf=_perf(perf_table, services, source.parent) if perf_table else {},
    )


def _host_name(host: _Table, default: str) -> str:
    """[host] name (default: the file's stem, or the inventory's host name): it names the host in test ids
    (`host/service`), file names and reports, so it is not empty and holds no '/', '\\' or control character."""
    given = host.get("name", str)
    name = default if given is None else given
    problem = host_name_problem(name)
    if problem:
        origin = "" if given is not None else " (the default: the file's or inventory host's name; set [host] name)"
        raise host.fail("name", f"expected a host name {problem}, got {name!r}{origin}")
    return name


def host_name_problem(name: str) -> str | None:
    """Why `name` cannot name a host (None: it can)."""
    if not name.strip():
        return "that is not empty"
    if "/" in name or "\\" in name:
        return "without '/' or '\\' (it is split on '/' in test ids: host/service)"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") for c in name):
        return "without control or invisible characters"
    if name != name.strip():
        return "without leading or trailing spaces"
    return None


def _become_user(host: _Table) -> str:
    """[host] become_user: a user name (`sudo -n -u NAME`), root unless told."""
    user = host.get("become_user", str, "root")
    assert user is not None
    if not re.fullmatch(BECOME_USER, user):
        raise host.fail("become_user", f"expected a user name (letters, digits, '_', '-', '.'), got {user!r}")
    return user


def resolve_profile_path(spec: str, hosts_dirs: list[Path]) -> Path:
    """A --host value: a path to a .toml file, or a name looked up in the hosts dirs."""
    candidate = Path(spec).expanduser()
    if candidate.suffix == ".toml" or "/" in spec:
        if candidate.is_file():
            return candidate
        raise InventoryError(spec, "", "no such host profile file")
    searched = [*hosts_dirs, BUILTIN_PROFILES]
    for directory in searched:
        path = directory / f"{spec}.toml"
        if path.is_file():
            return path
    known = sorted({p.stem for d in searched if d.is_dir() for p in d.glob("*.toml")})
    raise InventoryError(
        spec, "", f"no host profile named {spec!r} in {', '.join(str(d) for d in searched)}"
        + (f" (known: {', '.join(known)})" if known else "")
    )


def attach_profile(url: str, index: int) -> HostProfile:
    """A profile for --attach URL: one external service, no host access."""
    table = _Table({"url": url}, "--attach", "")
    checked = _check_url(table, "url", url)
    parsed = urllib.parse.urlparse(checked)
    name = f"{parsed.hostname}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"
    service = ServiceSpec(name="attached", kind="external", url=checked, algorithm=AUTO)
    return HostProfile(
        name=name if index == 0 else f"{name}#{index}",
        source=Path("--attach"),
        connection=None,
        python="python3",
        services={"attached": service},
        provision="never",
    )
