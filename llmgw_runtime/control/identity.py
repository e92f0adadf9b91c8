"""Node identity: may a node claim the address it reports? A pure decision: the caller
resolves names and passes the addresses in.

A node's address becomes the engine URLs routers send users' prompts to and the peers of
multi-node replicas, so a node may only claim an address it shows it owns: the address
its report came from, or one inside the networks the operator configured
(``LLMGW_AGENT_NETWORKS``, for agents behind a NAT or a proxy)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: str) -> Address | None:
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_problem(claimed: str | None, peer: str | None, resolved: Sequence[str],
                    networks: Sequence[Network]) -> str | None:
    """Why ``claimed`` may not be this node's address, or None when it may.

    ``peer`` is the address the report came from; ``resolved`` the addresses ``claimed``
    resolves to when it is a host name (empty when it is an IP address or does not
    resolve)."""
    if not claimed:
        return None
    peer_ip = _ip(peer or "")
    own = _ip(claimed)
    candidates = [own] if own is not None else [a for a in map(_ip, resolved) if a]
    if not candidates:
        return (f"the reported address {claimed!r} is neither an IP address nor a name "
                "that resolves here; set the agent's LLMGW_ADDRESS to this node's IP")
    for ip in candidates:
        if peer_ip is not None and ip == peer_ip:
            return None
        if any(ip.version == net.version and ip in net for net in networks):
            return None
    nets = ", ".join(str(n) for n in networks) or "none configured"
    return (f"the reported address {claimed} is not the address this node reports from "
            f"({peer or 'unknown'}) nor inside LLMGW_AGENT_NETWORKS ({nets}); routers would "
            "send prompts there. Set the agent's LLMGW_ADDRESS to the address it reaches "
            "the control service from, or add its network to LLMGW_AGENT_NETWORKS")


def url_host(address: str) -> str:
    """``address`` as the host part of a URL (IPv6 in brackets)."""
    ip = _ip(address)
    if isinstance(ip, ipaddress.IPv6Address):
        return f"[{ip}]"
    return address


def is_ip(text: str) -> bool:
    return _ip(text) is not None
