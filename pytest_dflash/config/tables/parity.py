"""[parity]: which service is the reference for the losslessness checks, and the tie thresholds, as a
`ParitySpec`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_dflash.config.profiles import ParitySpec, ServiceSpec
from pytest_dflash.config.tables.reader import Table


def parse_parity(table: Table, services: Mapping[str, ServiceSpec], profile_dir: Path) -> ParitySpec:
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
