"""Fixtures that hand tests a pool of rank processes of a given world size.

``IRIS_TEST_WORLD_SIZES`` (default ``1,2,4``) chooses the world sizes that
multi-rank tests run at; on a 2-GPU machine use ``1,2``, or keep ``1,2,4`` with
``IRIS_RANKS_PER_GPU=2`` (ranks share GPUs). Tests that need several ranks but
not every size (planted hangs, examples, whole traced runs) run at the smallest
multi-rank size listed, :data:`SMALL_WORLD`, and are skipped when none is.

Under emulation, the suites of :data:`CROSS_NODE_SUITES` also run their multi-rank tests
at four ranks as two "nodes" of two (:data:`CROSS_NODE`, test ids ``4ranks_2nodes``): each
kernel then reaches one peer through mapped pointers and two through the cross-node path
(``docs/scale_out.md``). ``IRIS_TEST_RANKS_PER_NODE=k`` instead starts every rank of every
pool with ``IRIS_RANKS_PER_NODE=k`` (how a GPU pass crosses nodes): all tests cross "nodes"
of k ranks.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from harness import RankPool, remove_stderr_folders  # noqa: E402

WORLD_SIZES = [int(n) for n in os.environ.get("IRIS_TEST_WORLD_SIZES", "1,2,4").split(",") if n]
MULTI_RANK_SIZES = [n for n in WORLD_SIZES if n > 1]
#: World size of the tests that need several ranks but not every size (None: skip them).
SMALL_WORLD = min(MULTI_RANK_SIZES) if MULTI_RANK_SIZES else None

_pools: dict[tuple, RankPool] = {}
_PER_NODE = os.environ.get("IRIS_TEST_RANKS_PER_NODE")
_NODES = {"IRIS_RANKS_PER_NODE": _PER_NODE} if _PER_NODE else {}

#: The suites whose multi-rank tests run across nodes too: every op, atomic, wait, tile
#: collective, collective, fused op, traced op and planted hang.
CROSS_NODE_SUITES = frozenset(
    "test_rma test_atomics test_sync test_tile_collectives test_upstream_api test_tracing "
    "test_ccl test_ops test_upstream_ops test_hang".split()
)


def _cross_node_layout() -> tuple[int, int] | None:
    # (ranks, ranks per node); only the emulation backend crosses nodes on one machine.
    import iris

    if _PER_NODE or 4 not in WORLD_SIZES or iris.BACKEND != "emulated":
        return None
    return (4, 2)


#: Four ranks as two nodes of two, or None where the suites do not cross nodes.
CROSS_NODE = _cross_node_layout()


def get_pool(world_size: int, **extra_env: str) -> RankPool:
    """A live pool of ``world_size`` ranks with ``extra_env`` set, started on first use."""
    # A loaded 2-core CI machine runs 4 interpreted ranks; a slow peer is not a hang.
    extra_env = {"IRIS_EMU_WAIT_TIMEOUT": "150", **_NODES, **extra_env}
    key = (world_size, tuple(sorted(extra_env.items())))
    pool = _pools.get(key)
    if pool is None or not pool.alive:
        pool = _pools[key] = RankPool(world_size, extra_env)
    return pool


def small_world_pool(**extra_env: str) -> RankPool:
    """:func:`get_pool` at :data:`SMALL_WORLD` ranks; skips the test when no multi-rank size is listed."""
    if SMALL_WORLD is None:
        pytest.skip("IRIS_TEST_WORLD_SIZES has no world size above 1")
    return get_pool(SMALL_WORLD, **extra_env)


def pytest_sessionfinish(session, exitstatus):
    for pool in _pools.values():
        pool.close()
    if exitstatus == 0:  # a failure may quote a dead rank's stderr file: keep them then
        remove_stderr_folders()


def layout_pool(layout: tuple[int, int | None], **extra_env: str) -> RankPool:
    """:func:`get_pool` for a ``(world_size, ranks_per_node)`` layout (None: one node)."""
    world_size, per_node = layout
    return get_pool(world_size, **({"IRIS_RANKS_PER_NODE": str(per_node)} if per_node else {}), **extra_env)


def layouts(sizes: list[int], module_name: str) -> list[tuple[int, int | None]]:
    """The layouts a test of ``module_name`` runs at: ``sizes`` on one node, and :data:`CROSS_NODE`."""
    found = [(n, None) for n in sizes]
    if CROSS_NODE and module_name in CROSS_NODE_SUITES and CROSS_NODE[0] in sizes:
        found.append(CROSS_NODE)
    return found


def layout_id(layout) -> str:
    if layout is None:
        return "noranks"
    world_size, per_node = layout
    return f"{world_size}ranks" + (f"_{world_size // per_node}nodes" if per_node else "")


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if "world" in metafunc.fixturenames:
        metafunc.parametrize("world", layouts(WORLD_SIZES, module), indirect=True, ids=layout_id)
    if "multi_world" in metafunc.fixturenames:
        found = layouts(MULTI_RANK_SIZES, module) or [None]
        metafunc.parametrize("multi_world", found, indirect=True, ids=layout_id)


@pytest.fixture
def world(request) -> RankPool:
    """Runs a test at every world size in ``IRIS_TEST_WORLD_SIZES`` (and across nodes: :data:`CROSS_NODE`)."""
    return layout_pool(request.param)


@pytest.fixture
def multi_world(request) -> RankPool:
    """Runs a test at every world size above one (and across nodes: :data:`CROSS_NODE`)."""
    if request.param is None:
        pytest.skip("IRIS_TEST_WORLD_SIZES has no world size above 1")
    return layout_pool(request.param)
