"""The TCP sockets a process listens on, read from /proc (Linux): what `ss -ltnp` shows, without its parsing."""

from __future__ import annotations

import os
import socket
from typing import List, Tuple


def _address(hexaddr: str, v6: bool) -> Tuple[str, int]:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if v6:
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(port, 16)
    return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)


def listening(pid: int) -> List[Tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on; [] when it is gone."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        return []
    found = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1], v6))
    return found


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1") or address.startswith("::ffff:127.")


def descendants(root: int) -> List[int]:
    """`root` and every process below it (a `raystream train` driver: its Ray cluster's processes, its workers)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return found
