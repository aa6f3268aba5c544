"""[services.NAME]: one inference service of a host (kind, URL, port, algorithm, how it is launched), as a
`ServiceSpec`.

The keys every kind shares are read here; the kind's own keys and its rules (a systemd service names its unit,
a process service has a command, a container service has the container keys, ...) are read by the kind's
table (config/tables/kinds.py), defined in the kind's file under services/ and registered by
services/registry.py.
"""

from __future__ import annotations

from pathlib import Path

from pytest_dflash.config.parallel import (
    LayoutError,
    gpus_disagree,
    parse_layout,
    visible_devices,
    visible_disagree,
)
from pytest_dflash.config.placeholders import placeholders, render
from pytest_dflash.config.profiles import ALGORITHMS, AUTO, HostProfile, ServiceSpec
from pytest_dflash.config.tables.kinds import KindTable, kind_tables
from pytest_dflash.config.tables.reader import Table, describe, parse_url
from pytest_dflash.scrub.redact import redact_url


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


def _kind(table: Table, host: HostProfile) -> KindTable:
    """The service's kind: `kind`, else the first registered kind that is the default on this host."""
    tables = kind_tables()
    default = next((name for name, kind in tables.items() if kind.default_for(host)), None)
    name = table.choice("kind", tuple(tables), default)
    if name is None:
        raise table.fail("kind", f"missing required key (expected one of {', '.join(tables)})")
    return tables[name]


def parse_service(name: str, table: Table, host: HostProfile, profile_dir: Path) -> ServiceSpec:
    kind = _kind(table, host)
    algorithm = table.get("algorithm", str, required=not kind.auto_algorithm) or AUTO
    if algorithm.upper() not in ALGORITHMS and not (kind.auto_algorithm and algorithm.upper() == AUTO):
        auto = " (or auto: read from /server_info)" if kind.auto_algorithm else ""
        allowed = ", ".join(ALGORITHMS) + auto
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
    template = None
    if template_raw:
        template = (profile_dir / template_raw).resolve()
        if not template.is_file():
            raise table.fail("template", f"expected a unit template file, {template} does not exist")
    # `gpus = "all"` is for a kind that says so; its table reads the "all"
    gpus = () if kind.all_gpus and table.raw("gpus") == "all" else table.int_list("gpus")
    _refuse_other_kinds_keys(table, kind)
    unaccepted_draft = table.get("unaccepted_draft", str)
    if unaccepted_draft is not None and algorithm.upper() in ("NONE", AUTO):
        raise table.fail("unaccepted_draft",
                         "only for a service with a speculative algorithm (this one has "
                         f"{'none' if algorithm.upper() == 'NONE' else 'no algorithm given'})")
    if unaccepted_draft is not None and not unaccepted_draft.strip():
        raise table.fail("unaccepted_draft",
                         "expected the reason why this service's draft cannot be accepted "
                         "(a non-empty string)")
    spec = ServiceSpec(
        name=name,
        kind=kind.name,
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
        nccl_init_timeout_s=table.duration("nccl_init_timeout", 120.0),
        api_key_env=table.get("api_key_env", str),
        model=table.get("model", str),
        unaccepted_draft=unaccepted_draft,
        structured_output=bool(table.get("structured_output", bool, True)),
    )
    spec = kind.read(table, spec, host, profile_dir)
    _check_gpus(table, spec)
    needs_port = any("{port}" in part for part in (spec.url, *spec.command))
    if spec.port is None and needs_port and not kind.auto_port:
        automatic = " or ".join(other.name for other in kind_tables().values() if other.auto_port)
        raise table.fail("port",
                         f"expected a fixed port: only {automatic or 'no'} services get an automatic one")
    table.done()
    return spec


def _check_gpus(table: Table, spec: ServiceSpec) -> None:
    """`gpus` against the command's --tp-size / --dp-size / --pp-size and the env's CUDA_VISIBLE_DEVICES,
    before anything starts. A size given as a placeholder the profile cannot fill is left to the env layer."""
    why = visible_disagree(spec.gpus, visible_devices(spec.env))
    if why:
        raise table.fail("gpus", why)
    if not spec.command:
        return
    argv = [render(arg, dict(spec.vars), where="command")
            if placeholders(arg) <= set(spec.vars) else arg for arg in spec.command]
    try:
        layout = parse_layout(argv)
    except LayoutError as exc:
        if "{" in str(exc):
            return  # filled in at start ({port}-like): the env layer checks the command as launched
        raise table.fail("command", str(exc)) from None
    why = gpus_disagree(layout, spec.gpus)
    if why:
        raise table.fail("gpus", why)


def _refuse_other_kinds_keys(table: Table, kind: KindTable) -> None:
    """A key of another kind's own, given here: 'only for kind = ...' where that kind says why; else it stays
    an unknown key (`Table.done`)."""
    for other in kind_tables().values():
        if other is kind or other.elsewhere is None:
            continue
        for key in other.keys:
            if table.raw(key) is not None:
                why = other.elsewhere.format(kind=kind.name)
                raise table.fail(key, f'only for kind = "{other.name}" ({why})')

