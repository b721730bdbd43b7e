"""The sandbox's network: a new network namespace holds only `lo`, down; bring it up.

netdevice(7): SIOCGIFFLAGS / SIOCSIFFLAGS on any socket, with a struct ifreq (16-byte name,
then the flags as a short). Needs CAP_NET_ADMIN over the namespace, which child B has.
"""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up_in_child() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
