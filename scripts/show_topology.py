"""Print the job's topology (iris.host.distributed.topology) from rank 0, after every rank checked it agrees.

    python -m iris.run -n 4 scripts/show_topology.py
    IRIS_RANKS_PER_NODE=2 python -m iris.run -n 4 scripts/show_topology.py   # two "nodes"

Each rank checks that the map's tiers match how the context routes (same node: mapped
memory; other nodes: NVSHMEM) and that every rank built the same map; rank 0 prints it,
with the communication groups.
"""

import iris
from iris.host.distributed.topology import InterconnectLevel, TopologyDiscovery

with iris.iris(1 << 20) as ctx:
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    discovery = TopologyDiscovery(ctx)
    topo = discovery.discover()
    for peer in range(world):
        same_node = ctx.node_of(rank) == ctx.node_of(peer)
        level = topo.get_interconnect_level(rank, peer)
        assert same_node == (level == InterconnectLevel.INTRA_NODE), (rank, peer, level)
    assert ctx.broadcast(topo.summary(), src=0) == topo.summary(), f"rank {rank} built another map"
    if rank == 0:
        print(topo.summary())
        for level, groups in discovery.get_communication_groups().items():
            print(f"{level}: {groups}")
        print("topology: every rank agrees, tiers match the context's routing")
