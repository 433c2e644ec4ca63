"""Fixtures that hand tests a pool of rank processes of a given world size.

``IRIS_TEST_WORLD_SIZES`` (default ``1,2,4``) chooses the world sizes that
multi-rank tests run at; on a 2-GPU machine use ``1,2``, or keep ``1,2,4`` with
``IRIS_RANKS_PER_GPU=2`` (ranks share GPUs). Tests that need several ranks but
not every size (planted hangs, examples, whole traced runs) run at the smallest
multi-rank size listed, :data:`SMALL_WORLD`, and are skipped when none is.

``IRIS_TEST_RANKS_PER_NODE=k`` starts every rank with ``IRIS_RANKS_PER_NODE=k``: the
same tests then cross "nodes" of k ranks (the cross-node path, ``docs/scale_out.md``).
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


@pytest.fixture(params=WORLD_SIZES, ids=lambda n: f"{n}ranks")
def world(request) -> RankPool:
    """Runs a test at every world size in ``IRIS_TEST_WORLD_SIZES``."""
    return get_pool(request.param)


@pytest.fixture(params=MULTI_RANK_SIZES or [None], ids=lambda n: f"{n}ranks")
def multi_world(request) -> RankPool:
    """Runs a test at every world size above one."""
    if request.param is None:
        pytest.skip("IRIS_TEST_WORLD_SIZES has no world size above 1")
    return get_pool(request.param)
