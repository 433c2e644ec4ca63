"""Where every rank runs and how it reaches every other: nodes, GPUs, links, fabric domains.

Upstream Iris's ``iris.host.distributed.topology``, with its names: a collective
:meth:`TopologyDiscovery.discover` gathers each rank's GPU facts (name, UUID, PCI bus,
NUMA node, NVLink fabric domain) and its node's facts (link type and peer access
between the GPUs it sees, InfiniBand devices), and builds a :class:`TopologyMap` that
classifies every pair of ranks into one of three tiers (:class:`InterconnectLevel`):
the same node, the same NVLink fabric domain on another node, or neither (RDMA).

A node here is what the context routes by (``ctx.node_of``: the launcher's
``LOCAL_WORLD_SIZE``, or ``IRIS_RANKS_PER_NODE``), so the tiers agree with the path
every device op takes: ranks of one node reach each other through mapped memory, the
others through NVSHMEM (docs/scale_out.md). One host split into several nodes by
``IRIS_RANKS_PER_NODE`` shows as ``host:node<N>``. How each fact is read is the
backend's (``Backend.describe_gpu``, ``Backend.local_links``); under emulation the
"GPUs" are the rank processes and every pair can reach the other.

Example:
    >>> topo = TopologyDiscovery(ctx).discover()          # every rank
    >>> topo.get_interconnect_level(0, ctx.get_num_ranks() - 1)
    <InterconnectLevel.INTRA_NODE: 0>
    >>> print(topo.summary())
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch.distributed as dist

from ..._pci import normalize_pci


class InterconnectLevel(IntEnum):
    """How two ranks reach each other, nearest first."""

    INTRA_NODE = 0
    INTRA_RACK_FABRIC = 1
    INTER_NODE_RDMA = 2

    def __str__(self) -> str:
        return self.name


class IntraNodeLinkType(IntEnum):
    """The link between two GPUs of one node (``nvidia-smi topo -m``'s classes)."""

    SELF = -1
    NVLINK = 0
    NVSWITCH = 1
    PCIE_SWITCH = 2
    PCIE_HOST_BRIDGE = 3
    PCIE_NUMA = 4
    PCIE_SYSTEM = 5
    UNKNOWN = 99

    def __str__(self) -> str:
        return self.name


@dataclass
class FabricInfo:
    """The NVLink fabric domain of a GPU (NVML's ``clusterUuid`` and ``cliqueId``).

    Two GPUs with the same :attr:`domain_key` reach each other over NVLink even on
    different nodes (a multi-node NVLink system); empty where the GPU reports none.

    Example:
        >>> FabricInfo("5e0a", 3).domain_key
        '5e0a:3'
    """

    cluster_uuid: str = ""
    clique_id: int = 0

    @property
    def is_valid(self) -> bool:
        """Whether the GPU reported a fabric domain."""
        return bool(self.cluster_uuid)

    @property
    def domain_key(self) -> str:
        """``"cluster_uuid:clique_id"``, or ``""`` without a fabric domain."""
        return f"{self.cluster_uuid}:{self.clique_id}" if self.is_valid else ""

    def to_dict(self) -> dict:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        return {"cluster_uuid": self.cluster_uuid, "clique_id": self.clique_id}

    @classmethod
    def from_dict(cls, d: dict) -> FabricInfo:
        """The inverse of :meth:`to_dict`; missing keys take the defaults."""
        return cls(cluster_uuid=d.get("cluster_uuid", ""), clique_id=int(d.get("clique_id", 0)))


@dataclass
class GPUInfo:
    """One rank's GPU, as that rank saw it.

    ``local_rank`` is the rank's index among its node's ranks; ``gpu_id`` the device
    index the rank uses (its process's numbering); ``numa_node`` -1 where unknown.

    Example:
        >>> topo.gpu_info[0].device_name
        'NVIDIA H200'
    """

    global_rank: int
    local_rank: int
    hostname: str
    gpu_id: int
    pci_bus_id: str
    device_name: str
    total_memory_mb: int
    numa_node: int
    vendor: str
    uuid: str
    fabric_info: FabricInfo = field(default_factory=FabricInfo)

    def to_dict(self) -> dict:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "fabric_info"}
        return {**fields, "fabric_info": self.fabric_info.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> GPUInfo:
        """The inverse of :meth:`to_dict` (``d`` is not modified)."""
        fields = {k: v for k, v in d.items() if k != "fabric_info"}
        return cls(**fields, fabric_info=FabricInfo.from_dict(d.get("fabric_info", {})))


@dataclass
class NodeInfo:
    """One node: its ranks, its GPUs and the links between them.

    ``link_types`` and ``p2p_access`` are indexed by device index (``gpu_id``) as the
    node's first rank numbers them; ``num_gpus`` counts physical GPUs (by UUID), so
    ranks that share a GPU (``IRIS_RANKS_PER_GPU``) make ``num_ranks > num_gpus``.

    Example:
        >>> node = topo.nodes[topo.gpu_info[0].hostname]
        >>> node.get_link_type(0, 1)
        <IntraNodeLinkType.NVLINK: 0>
    """

    hostname: str
    ranks: list[int] = field(default_factory=list)
    gpu_ids: list[int] = field(default_factory=list)
    unique_gpu_ids: list[int] = field(default_factory=list)
    unique_pci_ids: list[str] = field(default_factory=list)
    num_gpus: int = 0
    num_ranks: int = 0
    has_infiniband: bool = False
    ib_devices: list[str] = field(default_factory=list)
    link_types: list[list[int]] | None = None
    p2p_access: list[list[bool]] | None = None
    fabric_domain_key: str = ""
    fabric_domain_keys: list[str] = field(default_factory=list)

    def get_link_type(self, gpu_id_a: int, gpu_id_b: int) -> IntraNodeLinkType:
        """The link between two of this node's GPUs (``UNKNOWN`` outside the matrix).

        Example:
            >>> node.get_link_type(0, 0)
            <IntraNodeLinkType.SELF: -1>
        """
        if gpu_id_a == gpu_id_b:
            return IntraNodeLinkType.SELF
        if not _in_matrix(self.link_types, gpu_id_a, gpu_id_b):
            return IntraNodeLinkType.UNKNOWN
        return IntraNodeLinkType(self.link_types[gpu_id_a][gpu_id_b])

    def can_p2p_access(self, gpu_id_a: int, gpu_id_b: int) -> bool:
        """Whether GPU ``gpu_id_a`` can map GPU ``gpu_id_b``'s memory (a GPU always reaches itself).

        Example:
            >>> node.can_p2p_access(0, 1)
            True
        """
        if gpu_id_a == gpu_id_b:
            return True
        return _in_matrix(self.p2p_access, gpu_id_a, gpu_id_b) and bool(self.p2p_access[gpu_id_a][gpu_id_b])


def _in_matrix(matrix, row: int, col: int) -> bool:
    return matrix is not None and 0 <= row < len(matrix) and 0 <= col < len(matrix[row])


@dataclass
class TopologyMap:
    """Every rank's GPU and node, and the tier between any two ranks.

    Built by :meth:`TopologyDiscovery.discover`; the same on every rank.

    Example:
        >>> topo.get_node_peers(0)
        {1, 2, 3}
    """

    world_size: int
    num_nodes: int
    gpu_info: dict[int, GPUInfo]
    nodes: dict[str, NodeInfo]
    fabric_domains: dict[str, list[str]]

    def _node_name(self, rank: int) -> str:
        return self.gpu_info[rank].hostname

    def get_interconnect_level(self, rank_a: int, rank_b: int) -> InterconnectLevel:
        """The tier between two ranks: same node, same NVLink fabric domain, or RDMA.

        Example:
            >>> topo.get_interconnect_level(0, 0)
            <InterconnectLevel.INTRA_NODE: 0>
        """
        if rank_a == rank_b or self._node_name(rank_a) == self._node_name(rank_b):
            return InterconnectLevel.INTRA_NODE
        key = self.gpu_info[rank_a].fabric_info.domain_key
        if key and key == self.gpu_info[rank_b].fabric_info.domain_key:
            return InterconnectLevel.INTRA_RACK_FABRIC
        return InterconnectLevel.INTER_NODE_RDMA

    def get_node_peers(self, rank: int) -> set[int]:
        """The other ranks on ``rank``'s node.

        Example:
            >>> topo.get_node_peers(0)
            {1}
        """
        return set(self.nodes[self._node_name(rank)].ranks) - {rank}

    def get_fabric_domain_peers(self, rank: int) -> set[int]:
        """The other ranks in ``rank``'s NVLink fabric domain (empty without one).

        Example:
            >>> topo.get_fabric_domain_peers(0)
            set()
        """
        key = self.gpu_info[rank].fabric_info.domain_key
        if not key:
            return set()
        return {r for r, info in self.gpu_info.items() if r != rank and info.fabric_info.domain_key == key}

    def get_rdma_peers(self, rank: int) -> set[int]:
        """The ranks ``rank`` reaches neither on its node nor in its fabric domain.

        Example:
            >>> topo.get_rdma_peers(0)
            set()
        """
        near = self.get_node_peers(rank) | self.get_fabric_domain_peers(rank) | {rank}
        return set(self.gpu_info) - near

    def get_ranks_for_node(self, hostname: str) -> list[int]:
        """The ranks of node ``hostname``, sorted (empty for an unknown node).

        Example:
            >>> topo.get_ranks_for_node(topo.gpu_info[0].hostname)
            [0, 1]
        """
        node = self.nodes.get(hostname)
        return sorted(node.ranks) if node else []

    def get_ranks_for_fabric_domain(self, domain_key: str) -> list[int]:
        """The ranks of every node in fabric domain ``domain_key``, sorted.

        Example:
            >>> topo.get_ranks_for_fabric_domain(topo.gpu_info[0].fabric_info.domain_key)
        """
        hosts = self.fabric_domains.get(domain_key, [])
        return sorted(r for host in hosts for r in self.get_ranks_for_node(host))

    def summary(self) -> str:
        """A few lines for a person: nodes, their GPUs and ranks, fabric domains.

        Example:
            >>> print(topo.summary())
        """
        lines = [
            "Iris topology",
            f"world size {self.world_size}, {self.num_nodes} node(s), "
            f"{len(self.fabric_domains)} fabric domain(s)",
        ]
        for name, node in sorted(self.nodes.items()):
            shared = f", {node.num_ranks} ranks sharing them" if node.num_ranks > node.num_gpus else ""
            ib = ", ".join(node.ib_devices) if node.has_infiniband else "none"
            fabric = f", fabric {node.fabric_domain_key}" if node.fabric_domain_key else ""
            lines.append(
                f"  node {name}: {node.num_gpus} GPU(s), ranks {node.ranks}{shared}; InfiniBand: {ib}{fabric}"
            )
            for rank in node.ranks:
                info = self.gpu_info[rank]
                lines.append(
                    f"    rank {rank}: GPU {info.gpu_id} {info.device_name}, {info.total_memory_mb} MiB, "
                    f"PCI {info.pci_bus_id or '-'}, NUMA {info.numa_node}"
                )
            if node.link_types is not None and len(node.unique_gpu_ids) > 1:
                pairs = [
                    f"{a}-{b} {node.get_link_type(a, b)}"
                    for i, a in enumerate(node.unique_gpu_ids)
                    for b in node.unique_gpu_ids[i + 1 :]
                ]
                lines.append("    links: " + ", ".join(pairs))
        if self.fabric_domains:
            lines.append("  Fabric Domains:")
        for key, hosts in sorted(self.fabric_domains.items()):
            lines.append(f"    {key}: nodes {sorted(hosts)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


class TopologyDiscovery:
    """Finds the topology of the job, collectively (:meth:`discover` on every rank).

    Args:
        iris_ctx: the Iris context; without one, ``torch.distributed`` must be
            initialised, and this rank's GPU is ``LOCAL_RANK`` modulo the GPUs it sees
            (its nodes are then its hosts).

    Example:
        >>> discovery = TopologyDiscovery(ctx)
        >>> topo = discovery.discover()
        >>> discovery.get_communication_groups()[InterconnectLevel.INTRA_NODE]
        [[0, 1, 2, 3]]
    """

    def __init__(self, iris_ctx=None):
        self._ctx = iris_ctx
        self._topology: TopologyMap | None = None
        if iris_ctx is not None:
            self.rank, self.world_size, self.gpu_id = iris_ctx.cur_rank, iris_ctx.num_ranks, iris_ctx.gpu_id
            self._backend, self._device = iris_ctx.backend, iris_ctx.get_device()
            return
        if not dist.is_initialized():
            raise RuntimeError(
                "iris.host.distributed.topology: TopologyDiscovery() needs an Iris context or an initialized "
                "torch.distributed process group"
            )
        from ...backends import choose_backend_name, make_backend

        self._backend = make_backend(choose_backend_name())
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        count = max(1, self._backend.device_count())
        self.gpu_id = int(os.environ.get("LOCAL_RANK", 0)) % count
        self._device = self._backend.select_device(self.gpu_id, count)

    @property
    def topology(self) -> TopologyMap | None:
        """The map :meth:`discover` built (``None`` before it ran)."""
        return self._topology

    def discover(self) -> TopologyMap:
        """Gather every rank's facts and build the :class:`TopologyMap` (collective).

        Example:
            >>> topo = TopologyDiscovery(ctx).discover()
        """
        facts = dict(self._backend.describe_gpu(self._device))  # Backend.describe_gpu's keys
        fabric = FabricInfo(*facts.pop("fabric"))
        mine = {
            "gpu": GPUInfo(
                global_rank=self.rank,
                local_rank=0,
                hostname=self._node_name(),
                gpu_id=self.gpu_id,
                fabric_info=fabric,
                **facts,
            ).to_dict(),
            "node": {**_link_codes(self._backend.local_links()), **_infiniband()},
        }
        self._topology = _build_map(self.world_size, self._all_gather(mine))
        return self._topology

    def _node_name(self) -> str:
        host = socket.gethostname()
        ctx = self._ctx
        if ctx is None or not ctx.spans_nodes:
            return host
        # Ranks of different nodes may share a host (IRIS_RANKS_PER_NODE): name them apart.
        return f"{host}:node{ctx.node_of(self.rank)}"

    def _all_gather(self, facts: dict) -> list[dict]:
        if self._ctx is not None:
            return self._ctx._comm.all_gather_object(facts)
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, facts)
        return gathered

    def _require(self) -> TopologyMap:
        if self._topology is None:
            raise RuntimeError("iris.host.distributed.topology: call discover() first")
        return self._topology

    def get_communication_groups(self) -> dict[InterconnectLevel, list[list[int]]]:
        """The groups of ranks at each tier: one per node, one per fabric domain, all ranks.

        A node outside every fabric domain is a fabric group of its own; without fabric
        domains the fabric tier has no groups.

        Example:
            >>> discovery.get_communication_groups()[InterconnectLevel.INTER_NODE_RDMA]
            [[0, 1, 2, 3]]
        """
        topo = self._require()
        node_groups = [sorted(node.ranks) for _, node in sorted(topo.nodes.items())]
        fabric_groups: list[list[int]] = []
        if topo.fabric_domains:
            fabric_groups = [topo.get_ranks_for_fabric_domain(key) for key in sorted(topo.fabric_domains)]
            in_fabric = {host for hosts in topo.fabric_domains.values() for host in hosts}
            alone = [sorted(node.ranks) for name, node in sorted(topo.nodes.items()) if name not in in_fabric]
            fabric_groups += alone
        return {
            InterconnectLevel.INTRA_NODE: node_groups,
            InterconnectLevel.INTRA_RACK_FABRIC: fabric_groups,
            InterconnectLevel.INTER_NODE_RDMA: [sorted(topo.gpu_info)],
        }

    def get_heap_distribution_plan(self) -> dict[int, dict[str, Any]]:
        """Per rank, which peers it maps (same node), reaches over the fabric, or over RDMA.

        Here the node's peers are the heap's mapped peers, and every other peer is reached
        through NVSHMEM (docs/scale_out.md), whichever wire NVSHMEM then uses.

        Example:
            >>> discovery.get_heap_distribution_plan()[0]["ipc_peers"]
            [1, 2, 3]
        """
        topo = self._require()
        plan = {}
        for rank, info in topo.gpu_info.items():
            node_peers = topo.get_node_peers(rank)
            plan[rank] = {
                "ipc_peers": sorted(node_peers),
                "fabric_peers": sorted(topo.get_fabric_domain_peers(rank) - node_peers),
                "rdma_peers": sorted(topo.get_rdma_peers(rank)),
                "node": info.hostname,
                "local_rank": info.local_rank,
                "gpu_id": info.gpu_id,
                "fabric_domain": info.fabric_info.domain_key,
            }
        return plan


def _all_gather_strings(payload: str, world_size: int) -> list[str]:
    """Every rank's ``payload``, in rank order (collective; upstream's helper of the same name).

    Example:
        >>> _all_gather_strings(socket.gethostname(), dist.get_world_size())
        ['node-a', 'node-a', 'node-b', 'node-b']
    """
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, str(payload))
    return gathered


def _normalize_pci_bus_id(address: str) -> str:
    """A PCI bus id in sysfs form (``0000:41:00.0``), as upstream's helper of the same name.

    Example:
        >>> _normalize_pci_bus_id("00000000:4A:00.0")
        '0000:4a:00.0'
    """
    return normalize_pci(address)


#: The environment's visible-device lists by GPU vendor, in the order they are read.
_VISIBLE_DEVICES = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
}


def _logical_to_physical_gpu_index(logical: int, vendor: str) -> int:
    """The system's index of the GPU this process sees as ``logical``, through the visible-devices list.

    ``CUDA_VISIBLE_DEVICES`` for ``"nvidia"``; ``HIP_VISIBLE_DEVICES``, else
    ``ROCR_VISIBLE_DEVICES``, for ``"amd"``. ``logical`` comes back unchanged where no list is
    set, it lies outside the list, or its entry is not a number (a UUID). Upstream's helper of
    the same name; this package matches GPUs to ``nvidia-smi`` by PCI address instead.

    Example:
        >>> os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"
        >>> _logical_to_physical_gpu_index(1, "nvidia")
        3
    """
    names = _VISIBLE_DEVICES.get(vendor, ())
    entries = next((os.environ[name].split(",") for name in names if os.environ.get(name)), None)
    if entries is None or not 0 <= logical < len(entries):
        return logical
    entry = entries[logical].strip()
    return int(entry) if entry.isdigit() else logical


def _link_codes(links: dict) -> dict:
    # The backend names link classes (IntraNodeLinkType's names); the map keeps their values.
    names = links.get("link_types")
    codes = None if names is None else [[int(IntraNodeLinkType[name]) for name in row] for row in names]
    return {"link_types": codes, "p2p_access": links.get("p2p_access")}


def _infiniband() -> dict:
    # RDMA devices the kernel lists (a node without any reaches other nodes only over TCP).
    try:
        devices = sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        devices = []
    return {"has_ib": bool(devices), "ib_devices": devices}


def _build_map(world_size: int, gathered: list[dict]) -> TopologyMap:
    gpu_info = {}
    node_facts: dict[str, dict] = {}
    for entry in gathered:
        info = GPUInfo.from_dict(entry["gpu"])
        gpu_info[info.global_rank] = info
        node_facts.setdefault(info.hostname, entry["node"])  # the node's lowest rank speaks for it
    nodes = {}
    for host in node_facts:
        ranks = sorted(r for r, info in gpu_info.items() if info.hostname == host)
        for local_rank, rank in enumerate(ranks):
            gpu_info[rank].local_rank = local_rank
        infos = [gpu_info[r] for r in ranks]
        keys = sorted({i.fabric_info.domain_key for i in infos if i.fabric_info.domain_key})
        facts = node_facts[host]
        nodes[host] = NodeInfo(
            hostname=host,
            ranks=ranks,
            gpu_ids=[i.gpu_id for i in infos],
            unique_gpu_ids=sorted({i.gpu_id for i in infos}),
            unique_pci_ids=sorted({i.pci_bus_id for i in infos if i.pci_bus_id}),
            num_gpus=len({i.uuid for i in infos}),
            num_ranks=len(ranks),
            has_infiniband=facts["has_ib"],
            ib_devices=facts["ib_devices"],
            link_types=facts["link_types"],
            p2p_access=facts["p2p_access"],
            fabric_domain_key=keys[0] if keys else "",
            fabric_domain_keys=keys,
        )
    fabric_domains: dict[str, list[str]] = {}
    for host, node in sorted(nodes.items()):
        for key in node.fabric_domain_keys:
            fabric_domains.setdefault(key, []).append(host)
    return TopologyMap(world_size, len(nodes), gpu_info, nodes, fabric_domains)
