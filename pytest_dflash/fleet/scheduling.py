"""Hosts in parallel inside an xdist worker: which worker owns which host, decided the same way on both sides.

Under `-n N` the plugin runs `--dist loadgroup` (one host = one xdist group = one worker). Plain
LoadGroupScheduling hands a worker one group at a time, so a worker cannot know its next hosts and readies
them one after another. HostGroupScheduling instead gives each host group to a fixed owner: with the collected
host groups sorted by name, host i belongs to worker `gw{i % N}` (N = the workers xdist was asked for). A
worker, having collected the same items, computes the same list (`owned_hosts`) and pre-flights all of its
hosts at once before its first test (run/preflight.py), exactly as a run without xdist does.

Correctness over parallelism:

* A group whose owner is alive runs only on its owner: another worker running it would start the host's
  services a second time (its host lock, its ports) while the owner's pre-flight holds them.
* A group whose owner is gone (crashed, or never came up) may run on any worker, like plain loadgroup; so may
  groups that are not hosts. Replacement workers (`--maxworkerrestart`) get ids past `gw{N-1}`, own nothing,
  pre-flight nothing and take such orphans as they come.
* A worker left without runnable work waits (it may still inherit an orphan) and is shut down as soon as the
  queue is empty, so nothing hangs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import pytest

# xdist ships no py.typed (and pyproject's overrides do not list it): its classes are Any to mypy.
from xdist.remote import Producer  # type: ignore[import-untyped]
from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]
from xdist.workermanage import WorkerController  # type: ignore[import-untyped]

from pytest_dflash.run.state import DflashRun

# workerinput: the controller schedules hosts by owner (HostGroupScheduling)
OWNED_INPUT = "dflash_host_owners"
_WORKER_ID = re.compile(r"gw(\d+)")


def group_of(nodeid: str) -> str:
    """The xdist group of a node id (`path::test[params]@group` -> `group`), as LoadGroupScheduling splits
    it."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # an "@" inside the params is not a group
        return nodeid.split("@")[-1]
    return nodeid


def host_groups(nodeids: Iterable[str], hosts: Collection[str]) -> list[str]:
    """The targeted hosts that are a group of the collection, sorted: the list both sides index."""
    return sorted({group for group in map(group_of, nodeids) if group in hosts})


def owner_id(host: str, groups: Sequence[str], workers: int) -> str | None:
    """The gateway id of the worker that owns `host` (None: not a host group, or no workers)."""
    if workers < 1 or host not in groups:
        return None
    return f"gw{groups.index(host) % workers}"


def owned_hosts(nodeids: Iterable[str], hosts: Collection[str], worker_id: str, workers: int) -> list[str]:
    """The hosts the worker `worker_id` (of `workers`) runs under HostGroupScheduling; [] for a
    replacement."""
    match = _WORKER_ID.fullmatch(worker_id)
    if match is None or workers < 1:
        return []
    index = int(match.group(1))
    return [host for position, host in enumerate(host_groups(nodeids, hosts)) if position % workers == index]


class HostGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """LoadGroupScheduling whose host groups go to their owner (see the module docstring)."""

    assigned_work: dict[WorkerController, dict[str, dict[str, bool]]]  # the parent's: node -> its work units

    def __init__(self, config: pytest.Config, log: Producer | None = None, *, hosts: Collection[str]) -> None:
        super().__init__(config, log)
        self.hosts = frozenset(hosts)
        self.owners: dict[str, str] = {}  # host group -> owner's gateway id, fixed at the first schedule()

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)  # the same function the workers use

    def schedule(self) -> None:
        if self.collection is None and self.registered_collections:
            collection = next(iter(self.registered_collections.values()))
            workers = int(next(iter(self.registered_collections)).workerinput["workercount"])
            groups = host_groups(collection, self.hosts)
            self.owners = {host: owner for host in groups if (owner := owner_id(host, groups, workers))}
            # With more workers than work units the parent sends away the nodes listed last: list the owners
            # first, so no worker that pre-flights a host is sent away while another runs it.
            owning = set(self.owners.values())
            self.assigned_work = dict(sorted(self.assigned_work.items(),
                                             key=lambda entry: entry[0].gateway.id not in owning))
        super().schedule()

    def may_run(self, node: WorkerController, scope: str) -> bool:
        """A host group runs on its owner while the owner lives; anything else on any worker."""
        owner = self.owners.get(scope)
        return (owner is None or owner == node.gateway.id
                or all(n.gateway.id != owner for n in self.assigned_work))

    def _assign_work_unit(self, node: WorkerController) -> None:
        if node not in self.registered_collections:
            return  # a replacement whose collection has not arrived (or did not match): nothing to index
        scope = next((scope for scope in self.workqueue if self.may_run(node, scope)), None)
        if scope is None:
            return  # the rest belongs to other live owners: wait, an orphan may still come
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
        if not self.workqueue:
            # The parent shuts a node down at its next completed test; an idle node has none, so do it here.
            for other in self.nodes:
                if not other.shutting_down:
                    other.shutdown()


class HostScheduler:
    """Controller plugin, registered when the plugin's loadgroup switch is on and hosts are targeted: makes
    xdist use HostGroupScheduling and tells each worker so (it then pre-flights the hosts it owns)."""

    def __init__(self, config: pytest.Config, run: DflashRun) -> None:
        self.config = config
        self.run = run

    @pytest.hookimpl(tryfirst=True)  # before xdist's own choice (trylast) and a conftest's plain hook
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Producer) -> HostGroupScheduling:
        return HostGroupScheduling(config, log, hosts=list(self.run.profiles))

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[OWNED_INPUT] = self.asked_first()

    def asked_first(self) -> bool:
        """Whether xdist will take our scheduler: the nodes are set up before it asks, so look at the hook's
        order. If another plugin's hook comes first, the workers must not pre-flight by owner (it decides who
        runs what)."""
        impls = [impl for impl in self.config.hook.pytest_xdist_make_scheduler.get_hookimpls()
                 if not (impl.hookwrapper or impl.wrapper)]
        return bool(impls) and impls[-1].plugin is self  # pluggy calls the last one first


def worker_hosts(config: pytest.Config, nodeids: Iterable[str], hosts: Collection[str]) -> list[str] | None:
    """In an xdist worker whose controller schedules hosts by owner: the hosts this worker owns; else None."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or not workerinput.get(OWNED_INPUT):
        return None
    return owned_hosts(nodeids, hosts, str(workerinput.get("workerid", "")),
                       int(workerinput.get("workercount", 0)))


__all__ = ["OWNED_INPUT", "HostGroupScheduling", "HostScheduler", "group_of", "host_groups", "owned_hosts",
           "owner_id", "worker_hosts"]
