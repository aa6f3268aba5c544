"""Host profiles as the plugin holds them: `HostProfile` and the specs of its tables, validated.

A profile file is read and checked by config/loader.py (the file, [host]) and one module per table under
config/tables/ ([services.*], [parity], [floors.*], [perf]); what they build is defined here, so every other
package imports these classes without importing the validators.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_dflash.scrub.redact import redact_argv, redact_mapping_value, redact_url

ALGORITHMS = ("NONE", "DFLASH", "DDTREE", "EAGLE", "EAGLE3", "NGRAM", "STANDALONE")
# An external service whose profile names no algorithm: read from its /server_info before tests are selected
# (run/discovery.py); while unknown, only tests that do not depend on the algorithm select it.
AUTO = "AUTO"
DEFAULT_CONNECT_TIMEOUT_S = 4.0

ProvisionMode = Literal["never", "allowed", "always"]


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
    kind: str  # a registered kind's name (services/registry.py; its table: config/tables/kinds.py)
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
    # a tensor-parallel start-up: a rank in NCCL init (`Init torch distributed begin.` without `ends`) longer
    # than this fails the service, naming the rank (docs/profiles.md); real NCCL init takes seconds
    nccl_init_timeout_s: float = 120.0
    api_key_env: str | None = None
    model: str | None = None
    # AUTO that could not be resolved: why (the service layer fails with it)
    discovery_error: str | None = None
    # AUTO resolved to NONE only because the server answers no /server_info (not SGLang, or a gateway hiding
    # it): why its algorithm is unknown (the verdict says "unknown", never NONE)
    algorithm_unknown: str | None = None
    container: ContainerSpec | None = None  # kind = "container"
    log_command: str | None = None  # kind = "external": a command printing its log ({since}: unix time)
    log_file: str | None = None  # kind = "external": a log file on the host
    # A draft that knowingly cannot be accepted (a random-weight test draft): why. Lowers the default
    # accept-length minimum (1.1) to 1 token per verify step (layers/parity/acceptance.py).
    unaccepted_draft: str | None = None
    # False: the service serves no structured output (json_schema / regex / ebnf / response_format / forced
    # tool calls) on purpose, e.g. started with --grammar-backend none; the generation layer's structured
    # checks then do not apply to it instead of failing it (layers/generation/structured.py).
    structured_output: bool = True
    # What a kind's own keys say where no field above holds it: set by the kind's table (`KindTable.read`),
    # read by its manager; its shape is the kind's business (None for the built-in kinds).
    settings: Any = None

    @property
    def speculative(self) -> bool:
        return self.algorithm not in ("NONE", AUTO)

    @property
    def display_url(self) -> str:
        """The URL as every line the plugin prints or writes shows it: a password in it masked."""
        return redact_url(self.url)

    def configured(self) -> dict[str, Any]:
        """How the profile says to run it, as the verdict records it (secrets masked; `{port}` left as
        written, so two runs' commands compare): what "what changed" diffs when the service never came up."""
        command = [*self.command, *(self.container.args if self.container else ())]
        out: dict[str, Any] = {"kind": self.kind, "command": redact_argv(command) if command else None,
                               "unit": self.unit, "template": str(self.template) if self.template else None,
                               "image": self.container.image if self.container else None,
                               "env": {k: redact_mapping_value(k, v) for k, v in sorted(self.env.items())},
                               "gpus": list(self.gpus)}
        return {key: value for key, value in out.items() if value not in (None, [], {})}

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
    slo: Mapping[str, Any] = field(default_factory=dict)  # [slo], [slo.SERVICE]: config/tables/slo.py
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
