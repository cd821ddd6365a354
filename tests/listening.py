"""What a process tree listens on, read from /proc (no `ss` needed): for the loopback-only checks.

`listening_sockets(pid)` returns `(address, port)` of every listening TCP socket (IPv4 and IPv6) that
`pid` or any of its descendants holds. `is_loopback` accepts 127.0.0.0/8, ::1 and IPv4-mapped loopback.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"


def descendants(pid: int) -> set[int]:
    """`pid` and every live process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The command name may hold spaces or ')': the parent pid follows its last ')'.
                parent = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        tree.add(current)
        todo.extend(children.get(current, []))
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _decode(hex_addr: str) -> tuple[str, int]:
    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(addr, 16)))
    else:  # /proc prints IPv6 as four host-order 32-bit words
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", int(addr[i:i + 8], 16))
                                                         for i in range(0, 32, 8)))
    return ip, int(port, 16)


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """Listening TCP sockets held by `pid`'s process tree right now."""
    inodes = set().union(*(_socket_inodes(p) for p in descendants(pid)))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(_decode(fields[1]))
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
