"""Nothing a test starts may leave 127.0.0.1: isolated AWS settings and a socket guard (a pytest plugin).

Loaded by the root ``conftest.py``. On import it replaces every AWS setting of the environment with
fake credentials, no profile, no config or credentials file and the instance metadata service
(169.254.169.254) switched off, so botocore's credential chain never looks beyond the process, and
subprocesses (the emulator, the demo) inherit the same. During each test a wrapper around
``socket.socket.connect``/``connect_ex``/``sendto`` and ``socket.getaddrinfo`` refuses any address
outside 127.0.0.0/8 and ::1 (and any name but ``localhost``) *before* the real call, and records
it: the test then fails in teardown even if the code under test swallowed the error, as botocore
does for the metadata service.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

#: The environment every test runs in (and .ci/run exports): no way to real credentials.
ISOLATED_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Variables that would point botocore at other credentials; removed.
UNSET_AWS_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
ALLOWED = "only 127.0.0.0/8, ::1 and localhost"


def isolate_aws_environment(environ=os.environ) -> None:
    for name in UNSET_AWS_ENV:
        environ.pop(name, None)
    environ.update(ISOLATED_AWS_ENV)


class NetworkAccessBlocked(OSError):
    """A test tried to reach an address beyond the loopback range."""


def is_loopback_host(host) -> bool:
    """A literal loopback address or a loopback name (bytes, str or None as getaddrinfo takes)."""
    if host is None:  # getaddrinfo(None, port): the local host
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]")
    if host.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


class Guard:
    """Wraps the socket calls that open a connection or send a datagram; records what it refused."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self._real = {
            "connect": socket.socket.connect,
            "connect_ex": socket.socket.connect_ex,
            "sendto": socket.socket.sendto,
            "getaddrinfo": socket.getaddrinfo,
        }

    def check(self, family, address, what: str) -> None:
        if family == getattr(socket, "AF_UNIX", None):
            return
        host = address[0] if isinstance(address, tuple) and address else address
        if not is_loopback_host(host):
            self.refused.append(f"{what} {address!r}")
            raise NetworkAccessBlocked(f"{what} {address!r} refused: tests may reach {ALLOWED}")

    def install(self) -> None:
        guard, real = self, self._real

        def connect(sock, address):
            guard.check(sock.family, address, "connect to")
            return real["connect"](sock, address)

        def connect_ex(sock, address):
            guard.check(sock.family, address, "connect to")
            return real["connect_ex"](sock, address)

        def sendto(sock, data, *args):
            address = args[-1]
            guard.check(sock.family, address, "datagram to")
            return real["sendto"](sock, data, *args)

        def getaddrinfo(host, *args, **kwargs):
            guard.check(None, (host,), "name lookup of")
            return real["getaddrinfo"](host, *args, **kwargs)

        socket.socket.connect = connect
        socket.socket.connect_ex = connect_ex
        socket.socket.sendto = sendto
        socket.getaddrinfo = getaddrinfo


isolate_aws_environment()
GUARD = Guard()
GUARD.install()  # at import, so session fixtures and collection are guarded too


@pytest.fixture(autouse=True)
def _nothing_leaves_loopback():
    """Fails the test that tried to reach beyond 127.0.0.1, even where the error was swallowed."""
    before = len(GUARD.refused)
    yield
    refused = GUARD.refused[before:]
    del GUARD.refused[before:]
    if refused:
        pytest.fail("the test tried to leave the machine: " + "; ".join(refused), pytrace=False)
