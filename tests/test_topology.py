"""iris.host.distributed.topology: nodes, GPUs, links and tiers, from synthetic facts and from live ranks."""

import socket

import pytest
import torch.distributed as dist
from conftest import MULTI_RANK_SIZES, get_pool

import iris
from iris._pci import normalize_pci
from iris.backends._cuda_topology import parse_topo_matrix
from iris.host.distributed.topology import (
    FabricInfo,
    GPUInfo,
    InterconnectLevel,
    IntraNodeLinkType,
    NodeInfo,
    TopologyDiscovery,
    _all_gather_strings,
    _build_map,
    _logical_to_physical_gpu_index,
    _normalize_pci_bus_id,
)


def _facts(rank, host, gpu, uuid, domain=("", 0)):
    gpu_info = GPUInfo(rank, 0, host, gpu, f"0000:{gpu:02x}:00.0", "NVIDIA H200", 143000, 0, "nvidia", uuid)
    gpu_info.fabric_info = FabricInfo(*domain)
    links = [["SELF", "NVLINK"], ["NVLINK", "SELF"]]
    node = {
        "link_types": [[int(IntraNodeLinkType[name]) for name in row] for row in links],
        "p2p_access": [[True, True], [True, True]],
        "has_ib": host != "c",
        "ib_devices": ["mlx5_0"] if host != "c" else [],
    }
    return {"gpu": gpu_info.to_dict(), "node": node}


def _cluster():
    # Hosts a and b share an NVLink fabric domain; host c has none; on c two ranks share GPU 0.
    gathered = [
        _facts(0, "a", 0, "u0", ("f1", 7)),
        _facts(1, "a", 1, "u1", ("f1", 7)),
        _facts(2, "b", 0, "u2", ("f1", 7)),
        _facts(3, "b", 1, "u3", ("f1", 7)),
        _facts(4, "c", 0, "u4"),
        _facts(5, "c", 0, "u4"),
    ]
    return _build_map(6, gathered)


def test_fabric_domains_compare_by_cluster_and_clique():
    assert FabricInfo().domain_key == "" and not FabricInfo().is_valid
    assert FabricInfo("f1", 7).domain_key == "f1:7"
    assert FabricInfo("f1", 7).domain_key != FabricInfo("f1", 8).domain_key
    assert FabricInfo.from_dict({}) == FabricInfo()
    assert FabricInfo.from_dict(FabricInfo("f1", 7).to_dict()) == FabricInfo("f1", 7)


def test_gpu_info_survives_a_round_trip_and_leaves_its_input_alone():
    info = GPUInfo(3, 1, "a", 1, "0000:18:00.0", "NVIDIA H200", 143000, 0, "nvidia", "u3", FabricInfo("f", 2))
    data = info.to_dict()
    copy = dict(data)
    assert GPUInfo.from_dict(data) == info and data == copy
    del data["fabric_info"]
    assert GPUInfo.from_dict(data).fabric_info == FabricInfo()


def test_node_links_answer_inside_and_outside_the_matrix():
    node = NodeInfo("a", link_types=[[-1, 0], [0, -1]], p2p_access=[[True, False], [False, True]])
    assert node.get_link_type(0, 0) is IntraNodeLinkType.SELF
    assert node.get_link_type(0, 1) is IntraNodeLinkType.NVLINK
    assert node.get_link_type(0, 5) is IntraNodeLinkType.UNKNOWN
    assert node.can_p2p_access(1, 1) and not node.can_p2p_access(0, 1) and not node.can_p2p_access(0, 5)
    assert NodeInfo("b").get_link_type(0, 1) is IntraNodeLinkType.UNKNOWN
    assert not NodeInfo("b").can_p2p_access(0, 1)


def test_nvidia_smi_topology_matrix_is_read_by_gpu_index():
    text = (
        "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV18\tSYS\tPIX\t0-47\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tPHB\tSYS\t0-47\t0\t\tN/A\n"
        "GPU2\tSYS\tPXB\t X \tNODE\t48-95\t1\t\tN/A\n"
        "NIC0\tPIX\tSYS\tNODE\t X \n"
    )
    links = parse_topo_matrix(text)
    assert sorted(links) == [0, 1, 2]
    assert links[0] == {0: "SELF", 1: "NVLINK", 2: "PCIE_SYSTEM"}
    assert links[2][1] == "PCIE_SWITCH" and links[1][2] == "PCIE_HOST_BRIDGE"
    assert parse_topo_matrix("no GPUs here") == {}
    assert normalize_pci("00000000:1B:00.0") == "0000:1b:00.0"


def test_a_pci_address_is_found_inside_other_text_and_other_text_is_left_alone():
    assert _normalize_pci_bus_id("GPU 00000000:4A:00.0 (NVIDIA H200)") == "0000:4a:00.0"
    assert _normalize_pci_bus_id("0000:41:00.0") == "0000:41:00.0"
    assert _normalize_pci_bus_id(" Garbage ") == "garbage"


@pytest.mark.parametrize(
    "environment, vendor, logical, physical",
    [
        ({}, "nvidia", 3, 3),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, "nvidia", 1, 3),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, "nvidia", 5, 5),  # outside the list
        ({"CUDA_VISIBLE_DEVICES": "GPU-abcdef12"}, "nvidia", 0, 0),  # a UUID names no index
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, "nvidia", -1, -1),
        ({"HIP_VISIBLE_DEVICES": "7", "ROCR_VISIBLE_DEVICES": "9"}, "amd", 0, 7),
        ({"ROCR_VISIBLE_DEVICES": "1,3"}, "amd", 1, 3),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, "amd", 0, 0),  # another vendor's list
    ],
)
def test_a_logical_gpu_index_maps_through_the_vendors_visible_devices(
    monkeypatch, environment, vendor, logical, physical
):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert _logical_to_physical_gpu_index(logical, vendor) == physical


def test_the_map_puts_every_pair_of_ranks_in_one_tier():
    topo = _cluster()
    assert topo.num_nodes == 3 and sorted(topo.fabric_domains) == ["f1:7"]
    assert topo.get_interconnect_level(0, 1) is InterconnectLevel.INTRA_NODE
    assert topo.get_interconnect_level(1, 3) is InterconnectLevel.INTRA_RACK_FABRIC
    assert topo.get_interconnect_level(0, 4) is InterconnectLevel.INTER_NODE_RDMA
    assert topo.get_node_peers(2) == {3}
    assert topo.get_fabric_domain_peers(0) == {1, 2, 3} and topo.get_fabric_domain_peers(4) == set()
    assert topo.get_rdma_peers(0) == {4, 5} and topo.get_rdma_peers(4) == {0, 1, 2, 3}
    assert topo.get_ranks_for_node("b") == [2, 3] and topo.get_ranks_for_node("z") == []
    assert topo.get_ranks_for_fabric_domain("f1:7") == [0, 1, 2, 3]
    assert [topo.gpu_info[r].local_rank for r in range(6)] == [0, 1, 0, 1, 0, 1]
    shared = topo.nodes["c"]
    assert (shared.num_ranks, shared.num_gpus, shared.unique_gpu_ids) == (2, 1, [0])
    assert not shared.has_infiniband
    assert topo.nodes["a"].get_link_type(0, 1) is IntraNodeLinkType.NVLINK
    text = topo.summary()
    assert "3 node(s)" in text and "2 ranks sharing them" in text and "0-1 NVLINK" in text
    assert "Fabric Domains:\n    f1:7: nodes ['a', 'b']" in text


def _discovery_of(topo):
    discovery = TopologyDiscovery.__new__(TopologyDiscovery)
    discovery._topology = topo
    return discovery


def test_groups_and_the_heap_plan_follow_the_tiers():
    discovery = _discovery_of(_cluster())
    groups = discovery.get_communication_groups()
    assert groups[InterconnectLevel.INTRA_NODE] == [[0, 1], [2, 3], [4, 5]]
    assert groups[InterconnectLevel.INTRA_RACK_FABRIC] == [[0, 1, 2, 3], [4, 5]]
    assert groups[InterconnectLevel.INTER_NODE_RDMA] == [[0, 1, 2, 3, 4, 5]]
    plan = discovery.get_heap_distribution_plan()
    assert (plan[1]["ipc_peers"], plan[1]["fabric_peers"], plan[1]["rdma_peers"]) == ([0], [2, 3], [4, 5])
    assert plan[5] == {
        "ipc_peers": [4],
        "fabric_peers": [],
        "rdma_peers": [0, 1, 2, 3],
        "node": "c",
        "local_rank": 1,
        "gpu_id": 0,
        "fabric_domain": "",
    }


def test_discovery_must_run_before_its_answers():
    discovery = _discovery_of(None)
    with pytest.raises(RuntimeError, match="discover"):
        discovery.get_communication_groups()
    with pytest.raises(RuntimeError, match="discover"):
        discovery.get_heap_distribution_plan()


def test_discovery_without_a_context_needs_torch_distributed():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="torch.distributed"):
        TopologyDiscovery()


def test_upstream_module_path_is_this_module():
    import importlib

    upstream_path = importlib.import_module("iris.host.distributed.topology")
    assert upstream_path.TopologyDiscovery is TopologyDiscovery


def _discover_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        topo = TopologyDiscovery(ctx).discover()
        levels = [int(topo.get_interconnect_level(rank, peer)) for peer in range(world_size)]
        same_node = [ctx.node_of(rank) == ctx.node_of(peer) for peer in range(world_size)]
        context_nodes = len({ctx.node_of(r) for r in range(world_size)})
        assert _all_gather_strings(f"rank {rank}", world_size) == [f"rank {r}" for r in range(world_size)]
        return topo.summary(), topo.num_nodes, context_nodes, levels, same_node


def _ranks_share_a_gpu(world_size: int) -> bool:
    import torch

    return iris.BACKEND == "cuda" and torch.cuda.device_count() < world_size


@pytest.mark.parametrize("per_node", [None, 1], ids=["one_node", "a_node_per_rank"])
def test_live_ranks_agree_on_one_map_that_routes_as_the_context_does(multi_world, per_node):
    world_size = multi_world.world_size
    if per_node and world_size != min(MULTI_RANK_SIZES):
        pytest.skip("nodes of one rank: the smallest multi-rank world is enough")
    if per_node and _ranks_share_a_gpu(world_size):
        pytest.skip("nodes of one rank take NVSHMEM, which cannot serve ranks that share a GPU")
    pool = get_pool(world_size, IRIS_RANKS_PER_NODE=str(per_node)) if per_node else multi_world
    results = pool.run(_discover_body)
    summaries = {summary for summary, *_ in results}
    assert len(summaries) == 1, summaries
    for _, nodes, context_nodes, levels, same_node in results:
        assert nodes == context_nodes
        assert levels == [0 if same else 2 for same in same_node]  # no fabric domain under emulation
    if per_node == 1:
        assert f"{socket.gethostname()}:node1" in summaries.pop()


def test_cuda_links_follow_the_process_device_order(monkeypatch):
    # CUDA_VISIBLE_DEVICES=2,0: device 0 is nvidia-smi's GPU2, device 1 its GPU0.
    from types import SimpleNamespace

    import torch

    from iris.backends import _cuda_topology

    buses = {0: 0x9A, 1: 0x18}
    outputs = {
        "--query-gpu=index,pci.bus_id": "0, 00000000:18:00.0\n1, 00000000:2A:00.0\n2, 00000000:9A:00.0\n",
        "topo": "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV18\tSYS\nGPU1\tNV18\t X \tPHB\nGPU2\tSYS\tPHB\t X \n",
    }
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: False)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(pci_domain_id=0, pci_bus_id=buses[int(i)], pci_device_id=0),
    )
    monkeypatch.setattr(_cuda_topology, "_smi", lambda *args: outputs[args[0]])
    links = _cuda_topology.local_links()
    assert links["link_types"] == [["SELF", "PCIE_SYSTEM"], ["PCIE_SYSTEM", "SELF"]]
    assert links["p2p_access"] == [[True, False], [False, True]]
    monkeypatch.setattr(_cuda_topology, "_smi", lambda *args: (_ for _ in ()).throw(OSError("no nvidia-smi")))
    assert _cuda_topology.local_links()["link_types"] is None
