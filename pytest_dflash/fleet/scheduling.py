"""Under xdist: one host on one worker, with pytest's own test ids, and no crash can hang the run.

A host's lock, services and layer book live in one process, so all of a host's tests must run in one worker.
xdist's `loadgroup` would do that, but it renames every grouped test `path::test[params]@group` (so ids under
`-n` differ from ids without it: `--lf`, pasted ids and CI history break) and it hangs a run whose only worker
crashed (it re-queues the dead worker's finished work units, then sends the replacement an empty one, which
never reports back). So the plugin brings its own scheduler, HostScheduling, for every distributing `--dist`
mode but `each`:

* A test's host is read from its node id: the parameter ids the plugin gives a host's tests are known on
  the controller too (run/collection.py `param_ids`), so `test_x[sm120/dflash]` belongs to host `sm120`. The
  longest id found between `[`/`-` and `-`/`]` wins. Every other test is grouped as the `--dist` mode asked
  groups it: its module or class (`loadscope`), its file (`loadfile`), its `xdist_group` (`loadgroup`), else
  a work unit of its own (`load`, `worksteal`).
* Each host has a fixed owner: with the collected hosts sorted by name, host i belongs to worker `gw{i % N}`
  (N = the workers xdist was asked for). A worker, having collected the same items, computes the same list
  (`owned_hosts`) and pre-flights all of its hosts at once before its first test (run/preflight.py), exactly
  as a run without xdist does. A host whose owner is alive runs only on its owner (another worker would start
  its services a second time while the owner's pre-flight holds them); a host whose owner is gone (crashed, or
  never came up) and tests that are not a host's run on any worker. Replacement workers
  (`--max-worker-restart`) get ids past `gw{N-1}`, own nothing, pre-flight nothing and take such orphans.
* A crash loses one test, never the run: the test the dead worker was running is xdist's crash report (a
  failed test, and the run is interrupted: report/session.py) and is not run again (a test that kills its
  worker would do so again, until `--max-worker-restart` ends the run); the dead worker's other unfinished
  tests go back to the front of the queue; finished tests are never sent again, and no worker is ever sent an
  empty unit (xdist waits for a unit's tests to report back: an empty one never does). With `-n 1` the
  replacement picks up where the dead worker stopped.
* A worker left without runnable work waits (it may still inherit an orphan) and is shut down as soon as the
  queue is empty, so nothing hangs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import pytest

# xdist ships no py.typed (and pyproject's overrides do not list it): its classes are Any to mypy.
from xdist.remote import Producer  # type: ignore[import-untyped]
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]
from xdist.workermanage import WorkerController  # type: ignore[import-untyped]

from pytest_dflash.run.collection import param_ids
from pytest_dflash.run.state import DflashRun

# workerinput: the controller schedules hosts by owner (HostScheduling)
OWNED_INPUT = "dflash_host_owners"
_WORKER_ID = re.compile(r"gw(\d+)")
# A host's work unit; a NUL is in no node id, so it never equals a test's own unit.
HOST_SCOPE = "\0host:"
# --dist modes the plugin schedules itself: all but `no` and `each` (every test on every worker).
SCHEDULED_DIST = frozenset({"load", "loadgroup", "loadscope", "loadfile", "worksteal"})

ParamIds = Mapping[str, Collection[str]]  # host -> the parameter ids of its tests (run/collection.py)


def _escaped(text: str) -> str:
    """As pytest writes a non-ASCII parameter id into a node id (its `ascii_escaped`)."""
    return text if text.isascii() else text.encode("unicode_escape").decode("ascii")


class HostIds:
    """Parameter id -> host, built once per run: finding a node id's host costs a few dict lookups (a
    256-host fleet has thousands of tests, and the controller and every worker look each one up)."""

    def __init__(self, ids: ParamIds) -> None:
        # pytest escapes a non-ASCII id unless told not to (its "forfeit all rights" ini): both forms count
        self.hosts = {form: host for host, params in ids.items() for param in params
                      for form in (param, _escaped(param))}

    def host_of(self, nodeid: str) -> str | None:
        _, _, names = nodeid.partition("::")  # a test's names hold no "[" before its parameters
        start = names.find("[")
        if start < 0 or not names.endswith("]"):
            return None
        params = names[start + 1:-1]
        dashes = [index for index, char in enumerate(params) if char == "-"]
        starts, ends = [0, *(d + 1 for d in dashes)], [*dashes, len(params)]
        best, best_len = None, 0
        for first in starts:
            for end in ends:
                if end - first > best_len and (host := self.hosts.get(params[first:end])) is not None:
                    best, best_len = host, end - first
        return best


def _host_ids(ids: ParamIds | HostIds) -> HostIds:
    return ids if isinstance(ids, HostIds) else HostIds(ids)


def host_of(nodeid: str, ids: ParamIds | HostIds) -> str | None:
    """The host a node id's parameters name (None: no host's test). Parameter ids are joined by `-`, so an id
    counts only where it is a whole part; the longest such id wins (`gpu-a/x` over `gpu`)."""
    return _host_ids(ids).host_of(nodeid)


def scope_of(nodeid: str, ids: ParamIds | HostIds, dist: str = "load") -> str:
    """A node id's work unit: its host's, else what xdist's own `dist` scheduler would make it: its module or
    class (loadscope), its file (loadfile), its `xdist_group` (loadgroup: xdist's `@group`, added by xdist to
    the tests that ask for one, never by this plugin), else its own."""
    if (host := host_of(nodeid, ids)) is not None:
        return HOST_SCOPE + host
    if dist == "loadscope":
        return nodeid.rsplit("::", 1)[0]
    if dist == "loadfile":
        return nodeid.split("::", 1)[0]
    if dist == "loadgroup" and nodeid.rfind("@") > nodeid.rfind("]"):  # an "@" inside the params is no group
        return nodeid.split("@")[-1]
    return nodeid


def host_list(nodeids: Iterable[str], ids: ParamIds | HostIds) -> list[str]:
    """The hosts that have a test in the collection, sorted: the list both sides index."""
    by_param = _host_ids(ids)
    return sorted({host for nodeid in nodeids if (host := by_param.host_of(nodeid)) is not None})


def owner_id(host: str, hosts: Sequence[str], workers: int) -> str | None:
    """The gateway id of the worker that owns `host` (None: not a collected host, or no workers)."""
    if workers < 1 or host not in hosts:
        return None
    return f"gw{hosts.index(host) % workers}"


def owned_hosts(nodeids: Iterable[str], ids: ParamIds | HostIds, worker_id: str, workers: int) -> list[str]:
    """The hosts the worker `worker_id` (of `workers`) runs under HostScheduling; [] for a replacement."""
    match = _WORKER_ID.fullmatch(worker_id)
    if match is None or workers < 1:
        return []
    index = int(match.group(1))
    return [host for position, host in enumerate(host_list(nodeids, ids)) if position % workers == index]


class HostScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with a host as the scope, fixed owners and crash handling that cannot hang
    (see the module docstring)."""

    assigned_work: dict[WorkerController, dict[str, dict[str, bool]]]  # the parent's: node -> its work units

    def __init__(self, config: pytest.Config, log: Producer | None = None, *, ids: ParamIds) -> None:
        super().__init__(config, log)
        self.ids = HostIds(ids)
        self.dist = str(getattr(config.option, "dist", "load"))
        self.owners: dict[str, str] = {}  # host scope -> owner's gateway id, fixed at the first schedule()
        self._scopes: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        if (scope := self._scopes.get(nodeid)) is None:
            scope = self._scopes[nodeid] = scope_of(nodeid, self.ids, self.dist)
        return scope

    def schedule(self) -> None:
        if self.collection is None and self.registered_collections:
            collection = next(iter(self.registered_collections.values()))
            workers = int(next(iter(self.registered_collections)).workerinput["workercount"])
            hosts = host_list(collection, self.ids)
            self.owners = {HOST_SCOPE + host: owner for host in hosts
                           if (owner := owner_id(host, hosts, workers))}
            # With more workers than work units the parent sends away the nodes listed last: list the owners
            # first, so no worker that pre-flights a host is sent away while another runs it.
            owning = set(self.owners.values())
            self.assigned_work = dict(sorted(self.assigned_work.items(),
                                             key=lambda entry: entry[0].gateway.id not in owning))
        super().schedule()

    def may_run(self, node: WorkerController, scope: str) -> bool:
        """A host runs on its owner while the owner lives; anything else on any worker."""
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

    def remove_node(self, node: WorkerController) -> str | None:
        """A worker is gone: at the end of the run (nothing pending) or dead. Returns the test it died in;
        its other unfinished tests go back to the front of the queue, only those (see the module
        docstring)."""
        workload = self.assigned_work.pop(node)
        pending = {scope: nodeids for scope, unit in workload.items()
                   if (nodeids := [nodeid for nodeid, done in unit.items() if not done])}
        if not pending:
            return None
        crashitem = next(iter(pending.values()))[0]  # the first unfinished test it was sent: it ran that one
        for scope, nodeids in reversed(pending.items()):
            unit = {nodeid: False for nodeid in nodeids if nodeid != crashitem}
            if unit:
                self.workqueue[scope] = unit
                self.workqueue.move_to_end(scope, last=False)
        for other in list(self.assigned_work):
            self._reschedule(other)
        return crashitem


class HostScheduler:
    """Controller plugin, registered when hosts are targeted under a distributing `--dist`: makes xdist use
    HostScheduling and tells each worker so (it then pre-flights the hosts it owns)."""

    def __init__(self, config: pytest.Config, run: DflashRun) -> None:
        self.config = config
        self.run = run

    @pytest.hookimpl(tryfirst=True)  # before xdist's own choice (trylast) and a conftest's plain hook
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Producer) -> HostScheduling:
        return HostScheduling(config, log, ids=param_ids(self.run.profiles))

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[OWNED_INPUT] = self.asked_first()

    def asked_first(self) -> bool:
        """Whether xdist will take our scheduler: the nodes are set up before it asks, so look at the hook's
        order. If another plugin's hook comes first, the workers must not pre-flight by owner (it decides who
        runs what)."""
        impls = [impl for impl in self.config.hook.pytest_xdist_make_scheduler.get_hookimpls()
                 if not (impl.hookwrapper or impl.wrapper)]
        return bool(impls) and impls[-1].plugin is self  # pluggy calls the last one first


def worker_hosts(config: pytest.Config, nodeids: Iterable[str], run: DflashRun) -> list[str] | None:
    """In an xdist worker whose controller schedules hosts by owner: the hosts this worker owns; else None."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or not workerinput.get(OWNED_INPUT):
        return None
    return owned_hosts(nodeids, param_ids(run.profiles), str(workerinput.get("workerid", "")),
                       int(workerinput.get("workercount", 0)))


__all__ = ["HOST_SCOPE", "OWNED_INPUT", "SCHEDULED_DIST", "HostIds", "HostScheduler", "HostScheduling",
           "host_list", "host_of", "owned_hosts", "owner_id", "scope_of", "worker_hosts"]
