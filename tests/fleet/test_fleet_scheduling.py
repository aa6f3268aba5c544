"""HostScheduling (fleet/scheduling.py) driven directly, with stand-in worker nodes as xdist's own scheduler
tests do: which worker runs which host (read from pytest's own node ids), what happens when a worker dies, and
that no worker is left waiting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest

from pytest_dflash.fleet.scheduling import (
    HOST_SCOPE,
    OWNED_INPUT,
    HostScheduler,
    HostScheduling,
    ParamIds,
    host_of,
    owned_hosts,
    owner_id,
    scope_of,
)
from pytest_dflash.run.state import DflashRun


class Gateway:
    def __init__(self, gateway_id: str) -> None:
        self.id = gateway_id


class Node:
    """What the scheduler uses of xdist's WorkerController."""

    def __init__(self, gateway_id: str, workers: int) -> None:
        self.gateway = Gateway(gateway_id)
        self.workerinput: dict[str, object] = {"workerid": gateway_id, "workercount": workers}
        self.sent: list[int] = []
        self.done = 0
        self.shut = False

    @property
    def shutting_down(self) -> bool:
        return self.shut

    def send_runtest_some(self, indices: Sequence[int]) -> None:
        assert indices, "an empty unit never reports back: xdist would wait for it forever"
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shut = True

    def __repr__(self) -> str:
        return f"<Node {self.gateway.id}>"


def collection(tests_per_host: dict[str, int], plain: int = 0) -> list[str]:
    ids = [f"test_hosts.py::test_{step}[{host}/dflash]" for host, count in tests_per_host.items()
           for step in range(count)]
    return ids + [f"test_plain.py::test_{step}" for step in range(plain)]


def scheduler(pytester: pytest.Pytester, nodes: Sequence[Node], ids: list[str],
              hosts: Sequence[str]) -> HostScheduling:
    sched = HostScheduling(pytester.parseconfig(f"--tx={len(nodes)}*popen"), ids=param_ids(hosts))
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, ids)
    sched.schedule()
    return sched


def complete_one(sched: HostScheduling, node: Node) -> bool:
    """The node finishes the next test it was sent; False if it has none."""
    if node.done >= len(node.sent):
        return False
    node.done += 1
    sched.mark_test_complete(node, node.sent[node.done - 1])
    return True


def drain(sched: HostScheduling, nodes: Sequence[Node]) -> None:
    while any([complete_one(sched, node) for node in nodes if node in sched.nodes]):
        pass


def ran(node: Node, ids: list[str]) -> set[str]:
    return {ids[index] for index in node.sent}


def param_ids(hosts: Sequence[str]) -> ParamIds:
    return {host: {host, f"{host}/dflash"} for host in hosts}


def hosts_of(nodeids: set[str]) -> set[str]:
    return {host for nodeid in nodeids if (host := host_of(nodeid, param_ids(HOSTS))) is not None}


def hosts_ran(node: Node, ids: list[str]) -> set[str]:
    return hosts_of(ran(node, ids))


HOSTS = ["h1", "h2", "h3", "h4"]


def test_each_host_runs_on_its_owner_and_other_tests_anywhere(pytester: pytest.Pytester) -> None:
    ids = collection({host: 3 for host in HOSTS}, plain=2)
    nodes = [Node("gw0", 2), Node("gw1", 2)]
    sched = scheduler(pytester, nodes, ids, HOSTS)
    drain(sched, nodes)
    assert sched.tests_finished and all(node.shut for node in nodes)
    assert hosts_ran(nodes[0], ids) == {"h1", "h3"} and hosts_ran(nodes[1], ids) == {"h2", "h4"}
    assert sorted(nodes[0].sent + nodes[1].sent) == list(range(len(ids)))  # every test once, the plain ones too
    for node in nodes:  # the worker computes the same hosts from its own collection
        assert owned_hosts(ids, param_ids(HOSTS), node.gateway.id, 2) == sorted(hosts_ran(node, ids))


def test_a_dead_owners_hosts_go_to_the_workers_left(pytester: pytest.Pytester) -> None:
    ids = collection({host: 3 for host in HOSTS})
    nodes = [Node("gw0", 2), Node("gw1", 2)]
    sched = scheduler(pytester, nodes, ids, HOSTS)
    assert complete_one(sched, nodes[0])
    crashed = sched.remove_node(nodes[0])  # gw0 dies in its second test
    assert crashed == ids[nodes[0].sent[1]]
    drain(sched, [nodes[1]])
    survivors = ran(nodes[1], ids)
    assert hosts_of(survivors) == set(HOSTS)  # h1's rest and h3 too: correctness over parallelism
    # neither the test gw0 finished nor the one it died in (xdist reports that one as failed) runs again
    assert set(ids) - survivors == {ids[nodes[0].sent[0]], crashed}


def test_a_replacement_worker_takes_the_orphans_and_owns_nothing(pytester: pytest.Pytester) -> None:
    ids = collection({"h1": 6, "h2": 3, "h3": 6, "h4": 3})  # gw0 is busy with h1 when gw1 dies
    gw0, gw1 = Node("gw0", 2), Node("gw1", 2)
    sched = scheduler(pytester, [gw0, gw1], ids, HOSTS)
    complete_one(sched, gw1)
    crashed = sched.remove_node(gw1)
    replacement = Node("gw2", 2)  # xdist's id for a clone: the next free gwN
    sched.add_node(replacement)
    sched.add_node_collection(replacement, ids)
    sched.schedule()
    drain(sched, [gw0, replacement])
    assert "h2" in hosts_ran(replacement, ids)
    assert not hosts_ran(replacement, ids) & {"h1", "h3"}, "the live owner's hosts stay with it"
    assert ran(gw0, ids) | ran(replacement, ids) | {ids[gw1.sent[0]], crashed} == set(ids)
    assert owned_hosts(ids, param_ids(HOSTS), "gw2", 2) == []  # so it pre-flights nothing


@pytest.mark.parametrize("hosts", [{"h1": 6}, {"h1": 3, "h2": 2}, {}], ids=["one-host", "two-hosts", "plain"])
def test_with_one_worker_a_crash_never_hangs_the_run(pytester: pytest.Pytester, hosts: dict[str, int]) -> None:
    """-n 1: the only worker dies in its third test; its replacement gets every unfinished test but the one it
    died in (once, never a finished one, never an empty unit), and the run ends."""
    ids = collection(hosts, plain=6 if not hosts else 1)
    gw0 = Node("gw0", 1)
    sched = scheduler(pytester, [gw0], ids, HOSTS)
    assert complete_one(sched, gw0) and complete_one(sched, gw0)
    crashed = sched.remove_node(gw0)
    assert crashed == ids[gw0.sent[2]]
    replacement = Node("gw1", 1)
    sched.add_node(replacement)
    sched.add_node_collection(replacement, ids)
    sched.schedule()
    drain(sched, [replacement])
    assert sched.tests_finished and replacement.shut
    finished = {ids[index] for index in gw0.sent[:2]}
    assert sorted(ran(replacement, ids)) == sorted(set(ids) - {*finished, crashed})
    assert len(replacement.sent) == len(set(replacement.sent)), "no test runs twice"
    if len(gw0.sent) > 3:
        assert replacement.sent[0] == gw0.sent[3]  # it goes on where gw0 stopped


def test_with_more_workers_than_hosts_the_owners_stay(pytester: pytest.Pytester) -> None:
    ids = collection({"h1": 2, "h2": 2})
    nodes = [Node(f"gw{index}", 4) for index in (3, 2, 1, 0)]  # ready in any order; xdist drops the last ones
    sched = scheduler(pytester, nodes, ids, ["h1", "h2"])
    by_id = {node.gateway.id: node for node in nodes}
    assert sorted(node.gateway.id for node in sched.nodes) == ["gw0", "gw1"]
    assert by_id["gw2"].shut and by_id["gw3"].shut and not by_id["gw2"].sent and not by_id["gw3"].sent
    assert hosts_ran(by_id["gw0"], ids) == {"h1"} and hosts_ran(by_id["gw1"], ids) == {"h2"}


def test_an_idle_worker_waits_then_is_shut_down_with_the_queue_empty(pytester: pytest.Pytester) -> None:
    ids = collection({"h1": 1, "h2": 6, "h3": 1, "h4": 2})
    gw0, gw1 = Node("gw0", 2), Node("gw1", 2)
    sched = scheduler(pytester, [gw0, gw1], ids, HOSTS)
    while complete_one(sched, gw0):
        pass
    assert hosts_ran(gw0, ids) == {"h1", "h3"}
    assert not gw0.shut, "h4 is still queued: gw0 stays up in case gw1 dies"
    drain(sched, [gw1])
    assert hosts_ran(gw1, ids) == {"h2", "h4"}
    assert gw0.shut and gw1.shut and sched.tests_finished


@pytest.mark.parametrize(("nodeid", "host"), [
    ("t.py::test[h1/dflash]", "h1"),
    ("t.py::test[h1]", "h1"),
    ("t.py::Class::test[h1/ref~dflash]", "h1"),
    ("t.py::test[gpu-a-0]", "gpu-a"),  # another parameter after the host's: joined by "-"
    ("t.py::test[0-gpu-a/dflash]", "gpu-a"),
    ("t.py::test[gpu-a/x-gpu]", "gpu-a"),  # the longest whole id wins: "gpu" is only a part of x-gpu here
    ("t.py::test[gpu/x-gpu-a]", "gpu"),
    ("t.py::test[[::1]:8000/default]", "[::1]:8000"),
    ("t.py::test[alpha beta/dflash]", "alpha beta"),
    ("t.py::test[caf\\xe9/dflash]", "caf\xe9"),  # pytest escapes a non-ASCII id
    ("t.py::test[h10/dflash]", None),  # a host's id must be a whole part
    ("t.py::test[xh1]", None),
    ("t.py::test_plain", None),
    ("t.py::test_h1", None),
])
def test_host_of(nodeid: str, host: str | None) -> None:
    ids = {name: {name, f"{name}/dflash", f"{name}/ref~dflash", f"{name}/default", f"{name}/x-gpu"}
           for name in ("h1", "gpu", "gpu-a", "[::1]:8000", "alpha beta", "caf\xe9")}
    assert host_of(nodeid, ids) == host


@pytest.mark.parametrize(("nodeid", "dist", "scope"), [
    ("t.py::test[h1/dflash]", "load", HOST_SCOPE + "h1"),
    ("t.py::C::test[h1/dflash]", "loadscope", HOST_SCOPE + "h1"),
    ("t.py::test[other]@g", "loadgroup", "g"),  # a user's xdist_group under --dist loadgroup
    ("t.py::test[user@example/x]", "loadgroup", "t.py::test[user@example/x]"),  # an "@" in the params
    ("t.py::test_plain", "load", "t.py::test_plain"),
    ("t.py::test_plain", "worksteal", "t.py::test_plain"),
    ("d/t.py::C::test_plain", "loadscope", "d/t.py::C"),  # other tests grouped as xdist's own mode would
    ("d/t.py::C::test_plain", "loadfile", "d/t.py"),
])
def test_scope_of(nodeid: str, dist: str, scope: str) -> None:
    assert scope_of(nodeid, param_ids(["h1"]), dist) == scope


@pytest.mark.parametrize(("worker", "workers", "owned"), [
    ("gw0", 2, ["a", "c", "e"]), ("gw1", 2, ["b", "d"]), ("gw2", 2, []), ("gw4", 8, ["e"]), ("gw5", 8, []),
    ("custom-id", 2, []), ("gw0", 0, []),
])
def test_owned_hosts(worker: str, workers: int, owned: list[str]) -> None:
    ids = collection({host: 1 for host in "edcba"}, plain=1)  # sorted by name, not by collection order
    assert owned_hosts(ids, param_ids(list("abcdez")), worker, workers) == owned
    assert all(owner_id(host, sorted("abcde"), workers) == worker for host in owned)


class OtherScheduler:
    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> None:
        return None


def test_workers_pre_flight_by_owner_only_if_xdist_asks_our_scheduler_first(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("-n", "2")
    ours = HostScheduler(config, cast(DflashRun, None))  # the run is only read when the scheduler is made
    config.pluginmanager.register(ours, "dflash-host-scheduler")
    assert ours.asked_first()
    config.pluginmanager.register(OtherScheduler(), "another-scheduler")  # a conftest's, asked before ours
    assert not ours.asked_first()
    node = Node("gw0", 2)
    ours.pytest_configure_node(node)
    assert node.workerinput[OWNED_INPUT] is False


def test_dist_each_over_hosts_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """`--dist each` would run every host's tests in every worker at once (its services started N times)."""
    pytester.makepyfile("import pytest\n\n@pytest.mark.host\ndef test_host(dflash_host):\n    pass\n")
    (pytester.path / "solo.toml").write_text('[host]\nconnection = "local://"\n\n[services.dflash]\n'
                                             'kind = "external"\nalgorithm = "DFLASH"\nurl = "http://127.0.0.1:9"\n')
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--host", "solo.toml", "-n", "2", "--dist",
                                           "each", f"--dflash-report={reports}")
    assert result.ret == 4, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: --dist each runs every test on every xdist worker*"])
    assert '"verdict": "interrupted"' in (reports / "solo.verdict.json").read_text()
