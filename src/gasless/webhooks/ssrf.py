"""Where webhooks may point, checked at registration and again on every delivery connection.

A URL must be `https` on port 443 with a public host: no userinfo, no `localhost`, no IP literal or
resolved address that is private, loopback, link-local, multicast, reserved, unspecified, CGNAT
(100.64.0.0/10), ULA (fc00::/7), or an IPv6 form embedding such an IPv4 address (mapped, 6to4, NAT64).

At delivery the aiohttp connector resolves through `GuardedResolver`, which hands aiohttp only vetted
addresses: the connection goes to the address that was checked, so DNS rebinding cannot switch the target
between the check and the connect. Redirects are never followed (the caller passes allow_redirects=False).

`local_cidrs` (setting `webhook_local_receiver_cidrs`, empty by default) is for tests and localnet only:
addresses inside those networks are accepted, and for them plain `http` and any port are too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_URL_CHARS = 2_048
HTTPS_PORT = 443
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_BLOCKED_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")

Lookup = Callable[[str, int], Awaitable[list[str]]]


class UrlRefused(Exception):
    """A webhook URL or target address that may not be used; `reason` goes into `details.reason`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lowercase hostname or IP literal (without brackets)
    port: int
    literal: IPAddress | None


async def system_lookup(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (both families), via the OS resolver."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: IPAddress) -> bool:
    """A public unicast address (what a webhook may reach without the local-receiver setting)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.teredo is not None:
            return False
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public(embedded)
    if address in _CGNAT:
        return False
    return bool(
        address.is_global
        and not address.is_multicast
        and not address.is_private
        and not address.is_loopback
        and not address.is_link_local
        and not address.is_reserved
        and not address.is_unspecified
    )


@dataclass
class AddressPolicy:
    local_cidrs: tuple[IPNetwork, ...] = ()
    lookup: Lookup = field(default=system_lookup)

    @classmethod
    def from_cidrs(cls, cidrs: Sequence[str]) -> AddressPolicy:
        return cls(tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs))

    def is_local(self, address: IPAddress) -> bool:
        return any(address.version == net.version and address in net for net in self.local_cidrs)

    def check_address(self, address: IPAddress, target: Target) -> None:
        if self.is_local(address):
            return
        if not is_public(address):
            raise UrlRefused("private_address", f"{address} is not a public unicast address")
        if target.scheme != "https" or target.port != HTTPS_PORT:
            raise UrlRefused("scheme", "a webhook must use https on port 443")

    def parse(self, url: str) -> Target:
        """The URL's target, or UrlRefused for anything that is not a plain http(s) URL to a host."""
        if len(url) > MAX_URL_CHARS or not url.isascii() or any(c.isspace() for c in url):
            raise UrlRefused("malformed", "the URL must be ASCII without spaces, at most 2 048 characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise UrlRefused("malformed", "the URL does not parse") from None
        scheme = parts.scheme.lower()
        if scheme not in ("https", "http"):
            raise UrlRefused("scheme", "a webhook URL must use https")
        if parts.username is not None or parts.password is not None or "@" in parts.netloc:
            raise UrlRefused("userinfo", "a webhook URL must not carry credentials (user:password@)")
        if parts.fragment:
            raise UrlRefused("malformed", "a webhook URL must not have a #fragment")
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            raise UrlRefused("malformed", "the URL has no host")
        port = port if port is not None else (443 if scheme == "https" else 80)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
            if host in _BLOCKED_NAMES or host.endswith(".localhost"):
                raise UrlRefused("localhost", "localhost is not a public host") from None
            if "." not in host:
                raise UrlRefused("host", "the host must be a fully qualified public name") from None
        target = Target(scheme=scheme, host=host, port=port, literal=literal)
        # Outside the local-receiver exemption only https:443 is allowed; decide it before any lookup.
        if (scheme != "https" or port != HTTPS_PORT) and not self.local_cidrs:
            raise UrlRefused(
                "scheme" if scheme != "https" else "port", "a webhook must use https on port 443"
            )
        return target

    async def vet(self, url: str) -> Target:
        """Registration: the URL and every address its host resolves to now must be allowed."""
        target = self.parse(url)
        if target.literal is not None:
            self.check_address(target.literal, target)
            return target
        for address in await self.resolve(target):
            self.check_address(address, target)
        return target

    async def resolve(self, target: Target) -> list[IPAddress]:
        try:
            async with asyncio.timeout(
                5.0
            ):  # not wait_for: it can lose the delivery loop's stop (wait_event)
                found = await self.lookup(target.host, target.port)
        except (OSError, TimeoutError, UnicodeError):
            raise UrlRefused("dns", f"{target.host} does not resolve") from None
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
        if not addresses:
            raise UrlRefused("dns", f"{target.host} does not resolve")
        return addresses

    async def allowed_addresses(self, target: Target) -> list[IPAddress]:
        """Connect time: the host's addresses that pass, or UrlRefused when none does."""
        if target.literal is not None:
            self.check_address(target.literal, target)
            return [target.literal]
        allowed, refusal = [], None
        for address in await self.resolve(target):
            try:
                self.check_address(address, target)
                allowed.append(address)
            except UrlRefused as exc:
                refusal = exc
        if not allowed:
            raise refusal or UrlRefused("dns", f"{target.host} does not resolve")
        return allowed


class TargetRefused(OSError):
    """Raised by the resolver inside aiohttp (which wraps it as a connector error's `os_error`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"webhook target refused: {reason}")
        self.reason = reason


class GuardedResolver(AbstractResolver):
    """aiohttp resolver that returns only addresses the policy allows (the connector connects to those)."""

    def __init__(self, policy: AddressPolicy, scheme_of: Callable[[str, int], str]) -> None:
        self.policy = policy
        self.scheme_of = scheme_of

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        target = Target(scheme=self.scheme_of(host, port), host=host, port=port, literal=None)
        try:
            addresses = await self.policy.allowed_addresses(target)
        except UrlRefused as exc:
            raise TargetRefused(exc.reason) from None
        results: list[ResolveResult] = []
        for address in addresses:
            results.append(
                {
                    "hostname": host,
                    "host": str(address),
                    "port": port,
                    "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                    "proto": 0,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return results

    async def close(self) -> None:
        return None
