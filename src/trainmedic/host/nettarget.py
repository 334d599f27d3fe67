"""The data target a user names for the network measurement: parsed, checked, shown safely.

``--data-url`` takes an ``http://`` or ``https://`` URL or a ``host:port``;
:func:`parse_target` splits it or raises :class:`InputError` naming what is
wrong, and :func:`masked` hides a password it carries before it is shown.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

from trainmedic.errors import InputError

DEFAULT_PORTS = {"http": 80, "https": 443}
"""Port of a URL that names none, by scheme."""
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<name>[^:\[\]]+)):(?P<port>[0-9]+)$")
_HOSTNAME = re.compile(r"^[\w](?:[\w.-]*[\w])?$")


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (with an optional ``%zone``)."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _valid_host(host: str) -> bool:
    return is_ip_literal(host) or bool(_HOSTNAME.match(host))


def parse_target(target: str) -> tuple[str, str, int, str]:
    """Split a data target into ``(scheme, host, port, path)``.

    Accepts ``http://`` and ``https://`` URLs (path includes the query) and
    ``host:port`` / ``[v6addr]:port`` (scheme ``tcp``, path ``""``).

    Raises:
        InputError: naming the target, when it is none of these.
    """
    shown = repr(target)

    def bad(problem: str) -> InputError:
        return InputError(f"data URL {shown}: {problem}")

    if not target or any(c.isspace() for c in target) or not target.isprintable():
        raise bad("must not be empty or contain spaces or control characters")
    if "://" in target:
        try:
            parts = urllib.parse.urlsplit(target)
        except ValueError as exc:  # "Invalid IPv6 URL", a bad port spec, ...
            raise bad(" ".join(str(exc).split()).lower() or "not a URL") from None
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise bad(f"unsupported scheme {parts.scheme!r} (use http://, https:// or host:port)")
        host = parts.hostname or ""
        if not _valid_host(host):
            raise bad("no valid host name")
        try:
            port = parts.port
        except ValueError:
            raise bad("port must be a number from 1 to 65535") from None
        if port == 0:
            raise bad("port must be a number from 1 to 65535")
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        return scheme, host, port or DEFAULT_PORTS[scheme], path
    match = _HOST_PORT.match(target)
    if match is None:
        raise bad("expected http://..., https://... or host:port")
    host = match.group("v6") or match.group("name")
    if match.group("v6") is not None:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise bad("brackets must hold an IPv6 address") from None
    elif not _valid_host(host):
        raise bad("no valid host name")
    digits = match.group("port")
    port = int(digits) if len(digits) <= 5 else 0
    if not 1 <= port <= 65535:
        raise bad("port must be a number from 1 to 65535")
    return "tcp", host, port, ""


def masked(target: str) -> str:
    """``target`` without a password it may carry (reports get shared)."""
    if "://" not in target:
        return target
    parts = urllib.parse.urlsplit(target)
    if parts.password is None:
        return target
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc}"))
