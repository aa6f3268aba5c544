"""The first thing a run does (a `tryfirst` pytest_configure, before every other plugin's and conftest's, any
of which can block, fail or be killed): load the targets, and give every host the run names a verdict file
that says 'interrupted' until the run ends. A usage error in the targets, or a --gate given to a run that
runs no test body (--co, --setup-only, --setup-plan), or a report path that cannot be written, gives the
hosts it names such a verdict too. Registered through pytest_dflash.plugin.pytest_plugins; the rest of the
run is configured by the plugin."""

from __future__ import annotations

import uuid

import pytest

from pytest_dflash.config import options, output_paths
from pytest_dflash.config.targets import TARGETS_KEY, load_targets, named_despite_errors
from pytest_dflash.report import session as report_session
from pytest_dflash.report.verdict import BUILDER_KEY, VerdictBuilder
from pytest_dflash.run import cleanup


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    begin(config)


def begin(config: pytest.Config) -> None:
    """The start of the run (also called by the plugin itself when this module was blocked with `-p no:`)."""
    workerinput = getattr(config, "workerinput", None)
    run_id = (workerinput.get("dflash_run_id") if workerinput else None) or uuid.uuid4().hex[:12]
    builder = VerdictBuilder(run_id)
    config.stash[BUILDER_KEY] = builder
    writes = report_session.writes_verdicts(config)
    try:
        profiles = load_targets(config)
    except pytest.UsageError as exc:
        if writes:
            report_session.refuse(config, builder, options.report_dir(config),
                                  named_despite_errors(config), exc)
        raise
    config.stash[TARGETS_KEY] = profiles
    if (refusal := options.gate_without_test_bodies(config)) is not None:
        # also under --co: an older verdict file must not stand beside a gate that was refused
        report_session.refuse(config, builder, options.report_dir(config), list(profiles), refusal)
        raise refusal
    if writes and profiles and (unwritable := output_paths.unwritable_output(config)) is not None:
        # now, not as pytest-html's INTERNALERROR or a host's failed check after the whole run
        report_session.refuse(config, builder, options.report_dir(config), list(profiles), unwritable)
        raise unwritable
    if profiles:
        cleanup.arm_signals(config)  # a SIGTERM from here on is an interrupted run (exit 2), not a killed one
    if writes and profiles:
        report_session.start(config, builder, options.report_dir(config), profiles)
