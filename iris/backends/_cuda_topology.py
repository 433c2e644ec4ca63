"""What ``iris.host.distributed.topology`` learns about NVIDIA GPUs: facts per GPU, links between them.

Everything comes from the driver through torch (name, memory, UUID, PCI address, peer
access), from sysfs (NUMA node), from ``nvidia-smi topo -m`` (the link class between
two GPUs), and from NVML through ``cuda.bindings.nvml`` where that module is installed
(the NVLink fabric domain of multi-node NVLink systems). A source that is missing or
fails leaves its fact unknown (``""``, -1, ``None``) rather than failing discovery.
"""

from __future__ import annotations

import logging
import re
import subprocess

import torch

from .._pci import normalize_pci

_log = logging.getLogger("iris")

#: ``nvidia-smi topo -m``'s cell labels, as ``iris.host.distributed.topology.IntraNodeLinkType`` names.
_SMI_LINKS = {
    "X": "SELF",
    "PIX": "PCIE_SWITCH",
    "PXB": "PCIE_SWITCH",
    "PHB": "PCIE_HOST_BRIDGE",
    "NODE": "PCIE_NUMA",
    "SYS": "PCIE_SYSTEM",
}


def pci_address(props) -> str:
    """``props``'s PCI address as sysfs writes it (``"0000:18:00.0"``), or ``""`` if torch has none.

    Example:
        >>> pci_address(torch.cuda.get_device_properties(0))
        '0000:18:00.0'
    """
    try:
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        return ""


def numa_node(pci: str) -> int:
    """The NUMA node of the PCI device at ``pci`` (-1 when unknown).

    Example:
        >>> numa_node("0000:18:00.0")
        0
    """
    try:
        with open(f"/sys/bus/pci/devices/{pci}/numa_node") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return -1


def fabric_domain(uuid: str) -> tuple[str, int]:
    """``(cluster_uuid, clique_id)`` of the GPU with ``uuid`` from NVML; ``("", 0)`` without one.

    Example:
        >>> fabric_domain(str(torch.cuda.get_device_properties(0).uuid))
        ('', 0)
    """
    try:
        from cuda.bindings import nvml

        nvml.init_v2()
        try:
            handle = nvml.device_get_handle_by_uuid(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            info = nvml.device_get_gpu_fabric_info_v(handle)
            cluster = bytes(info.cluster_uuid).hex()
            return (cluster, int(info.clique_id)) if int(cluster or "0", 16) else ("", 0)
        finally:
            nvml.shutdown()
    except Exception as error:  # no NVML module, no fabric manager, an older driver: no domain
        _log.debug("iris.host.distributed.topology: no NVLink fabric domain from NVML (%s)", error)
        return "", 0


def describe_gpu(device: torch.device) -> dict:
    """``Backend.describe_gpu`` for a CUDA device.

    Example:
        >>> describe_gpu(torch.device("cuda", 0))["device_name"]
        'NVIDIA H200'
    """
    props = torch.cuda.get_device_properties(device)
    pci = pci_address(props)
    uuid = str(props.uuid)
    return {
        "device_name": props.name,
        "uuid": uuid,
        "pci_bus_id": pci,
        "total_memory_mb": props.total_memory // (1 << 20),
        "numa_node": numa_node(pci) if pci else -1,
        "vendor": "nvidia",
        "fabric": fabric_domain(uuid),
    }


def parse_topo_matrix(text: str) -> dict[int, dict[int, str]]:
    """The GPU-to-GPU cells of ``nvidia-smi topo -m``, as link names by nvidia-smi's GPU index.

    ``NV<n>`` (n bonded NVLinks, directly or through NVSwitch) is ``NVLINK``; the PCIe
    classes follow ``_SMI_LINKS``; anything else is ``UNKNOWN``.

    Example:
        >>> parse_topo_matrix("\\tGPU0\\tGPU1\\nGPU0\\t X \\tNV18\\nGPU1\\tNV18\\t X \\n")[0][1]
        'NVLINK'
    """
    rows = [line.split("\t") for line in text.splitlines() if line.strip()]
    headers = (row for row in rows if not row[0].strip() and any(c.strip() == "GPU0" for c in row))
    header = next(headers, None)
    if header is None:
        return {}
    columns = {i: int(c.strip()[3:]) for i, c in enumerate(header) if re.fullmatch(r"GPU\d+", c.strip())}
    links: dict[int, dict[int, str]] = {}
    for row in rows:
        name = row[0].strip()
        if not re.fullmatch(r"GPU\d+", name):
            continue
        cells = links.setdefault(int(name[3:]), {})
        for i, gpu in columns.items():
            if i < len(row):
                label = row[i].strip()
                cells[gpu] = "NVLINK" if re.fullmatch(r"NV\d+", label) else _SMI_LINKS.get(label, "UNKNOWN")
    return links


def _smi(*args: str) -> str:
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def local_links() -> dict:
    """``Backend.local_links`` for the CUDA devices this process sees.

    Example:
        >>> local_links()["p2p_access"][0][1]
        True
    """
    count = torch.cuda.device_count()
    p2p = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(count)] for i in range(count)]
    try:
        smi_index = {}
        for line in _smi("--query-gpu=index,pci.bus_id", "--format=csv,noheader").splitlines():
            index, pci = line.split(",", 1)
            smi_index[normalize_pci(pci)] = int(index)
        order = [smi_index[pci_address(torch.cuda.get_device_properties(i))] for i in range(count)]
        matrix = parse_topo_matrix(_smi("topo", "-m"))
        names = [[matrix[a][b] if a != b else "SELF" for b in order] for a in order]
    except (OSError, subprocess.SubprocessError, KeyError, ValueError) as error:
        _log.debug("iris.host.distributed.topology: no link classes from nvidia-smi (%s)", error)
        names = None
    return {"link_types": names, "p2p_access": p2p}
