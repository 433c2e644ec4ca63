"""PCI addresses in one form, whatever wrote them: sysfs's ``0000:1b:00.0``.

Tools spell a GPU's address differently (``nvidia-smi`` writes ``00000000:1B:00.0``,
torch gives the parts as numbers); topology discovery compares them across sources and
ranks, for any vendor, so the one normal form lives here, below host code and backends.
"""

from __future__ import annotations

import re


def normalize_pci(address: str) -> str:
    """A PCI address in sysfs form whatever its source (nvidia-smi writes ``00000000:18:00.0``).

    The first address in ``address`` counts (``"GPU 0000:41:00.0"`` gives ``"0000:41:00.0"``);
    text that holds none comes back stripped and in lower case.

    Example:
        >>> normalize_pci("00000000:1B:00.0")
        '0000:1b:00.0'
    """
    match = re.search(r"\b([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\b", address)
    if not match:
        return address.strip().lower()
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"
