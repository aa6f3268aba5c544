"""[services.NAME]: one inference service of a host (kind, URL, unit, command, container), as a
`ServiceSpec`."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from pytest_dflash.config.profiles import ALGORITHMS, AUTO, ContainerSpec, HostProfile, ServiceSpec
from pytest_dflash.config.tables.reader import Table, describe, parse_url
from pytest_dflash.scrub.redact import redact_url

SERVICE_KINDS = ("systemd", "process", "external", "container")
CONTAINER_ENGINES = ("docker", "podman")
# The container keys of a [services.NAME] table with kind = "container" (docs/profiles.md).
CONTAINER_KEYS = ("engine", "runtime", "container", "label", "image", "args", "devices", "mounts", "network",
                  "ipc", "shm_size", "restart", "memory", "ulimits", "run_args", "stop_timeout")


def _url_host(address: str) -> str:
    """A host name or address as it goes into a URL: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def check_url(table: Table, name: str, url: str) -> str:
    probe = url.replace("{port}", "1").replace("{address}", "host")
    expected = "an http(s) URL"
    parsed = parse_url(table, name, probe, expected)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise table.fail(name, f"expected {expected}, got {redact_url(url)!r}")
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise table.fail(name,
                         f"expected an http(s) URL with a numeric port, got {redact_url(url)!r}") from None
    return url.rstrip("/")


def parse_service(name: str, table: Table, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    kind = table.choice("kind", SERVICE_KINDS,
                        "systemd" if host.connection and not host.is_local else "process")
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
        raise table.fail("port", f'expected a TCP port number or "auto", got {describe(port)}')
    default_url = None
    if host.address:
        default_url = f"http://{_url_host(host.address)}:{port_value or '{port}'}"
    elif host.is_local:
        default_url = f"http://127.0.0.1:{port_value or '{port}'}"
    url = table.get("url", str, default_url)
    if url is None:
        raise table.fail("url", "missing required key (expected an http(s) URL)")
    url = check_url(table, "url", url)
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
            raise table.fail("command",
                             'missing required key for kind = "process" (expected a list of strings)')
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
        raise table.fail("unaccepted_draft",
                         "only for a service with a speculative algorithm (this one has "
                         f"{'none' if algorithm.upper() == 'NONE' else 'no algorithm given'})")
    if unaccepted_draft is not None and not unaccepted_draft.strip():
        raise table.fail("unaccepted_draft",
                         "expected the reason why this service's draft cannot be accepted "
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


def _container(table: Table, kind: str) -> ContainerSpec:
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
