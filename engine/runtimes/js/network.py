"""The network policy of JS activities: `allowed_host` patterns (`[scheme://]host[:port]`,
`*` wildcards; see the README's "JS activities"). An outgoing `fetch` (and every redirect
it follows) must match one of the activity's patterns."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

#: The schemes a pattern may name, with their default ports.
DEFAULT_PORTS = {"http": 80, "https": 443}


_PATTERN = re.compile(
    r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*|\*)://)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]?#@]+)"
    r"(?::(?P<port>[0-9]{1,5}|\*))?/?"
)


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One parsed `allowed_hosts` entry (`[scheme://]host[:port]`)."""

    pattern: str
    schemes: frozenset[str]
    host: re.Pattern[str]
    port: int | Literal["*"] | None  # None: the URL scheme's default port only

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        m = _PATTERN.fullmatch(text.strip())
        if m is None:
            raise ValueError(
                f"invalid allowed_host pattern {text!r}: expected [scheme://]host[:port], "
                "e.g. 'api.example.com', '*.example.com', 'http://localhost:*'"
            )
        scheme = (m.group("scheme") or "*").lower()
        if scheme == "*":
            schemes = frozenset(DEFAULT_PORTS)
        elif scheme in DEFAULT_PORTS:
            schemes = frozenset({scheme})
        else:
            raise ValueError(
                f"invalid allowed_host pattern {text!r}: scheme must be http, https or *"
            )
        host = m.group("host").lower()
        if host.startswith("["):
            host_re = re.compile(re.escape(host[1:-1]))
        else:
            host_re = re.compile(".+".join(re.escape(part) for part in host.split("*")))
        port_text = m.group("port")
        port: int | Literal["*"] | None
        if port_text is None:
            port = None
        elif port_text == "*":
            port = "*"
        else:
            port = int(port_text)
            if not 0 < port < 65536:
                raise ValueError(f"invalid allowed_host pattern {text!r}: bad port {port}")
        return cls(pattern=text, schemes=schemes, host=host_re, port=port)

    def matches(self, scheme: str, host: str, port: int) -> bool:
        """Whether a URL with this (lowercase) scheme, host and effective port matches."""
        if scheme not in self.schemes or self.host.fullmatch(host.lower()) is None:
            return False
        if self.port is None:
            return port == DEFAULT_PORTS[scheme]
        return self.port == "*" or self.port == port


@functools.lru_cache(maxsize=256)
def _parse_allowed_hosts_cached(patterns: tuple[str, ...]) -> tuple[HostPattern, ...]:
    return tuple(HostPattern.parse(p) for p in patterns)


def parse_allowed_hosts(patterns: Iterable[str]) -> tuple[HostPattern, ...]:
    """Parse `allowed_hosts` patterns; raises `ValueError` naming a malformed one."""
    return _parse_allowed_hosts_cached(tuple(patterns))
