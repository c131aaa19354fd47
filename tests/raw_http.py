"""Raw HTTP for the guard's tests: bytes no well-behaved client would send."""

from __future__ import annotations

import socket


def exchange(host: str, port: int, raw: bytes, timeout_s: float = 60) -> bytes:
    """Send raw bytes, close the sending side, read until the other side closes."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    return data
