"""STOMP destinations onto Scow addresses, with Artemis's routing-type prefixes.

As Artemis's `anycastPrefix` / `multicastPrefix` acceptor parameters do, a destination
starting with the anycast prefix (e.g. `/queue/`) names the address after it with
anycast routing, one starting with the multicast prefix (e.g. `/topic/`) with multicast;
any other destination is the address itself, routed as the address (or its settings'
default routing type) says. A `destination-type` header (ANYCAST or MULTICAST) chooses
too, as in Artemis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scow.core import InvalidField, RoutingType


@dataclass(frozen=True)
class Destinations:
    anycast_prefix: str = ""
    multicast_prefix: str = ""

    def resolve(
        self, destination: str, headers: Mapping[str, str]
    ) -> tuple[str, RoutingType | None]:
        """The address and routing type a destination names (None: the address's own)."""
        routing: RoutingType | None = None
        address = destination
        if self.anycast_prefix and destination.startswith(self.anycast_prefix):
            address, routing = destination[len(self.anycast_prefix) :], RoutingType.ANYCAST
        elif self.multicast_prefix and destination.startswith(self.multicast_prefix):
            address, routing = destination[len(self.multicast_prefix) :], RoutingType.MULTICAST
        kind = headers.get("destination-type")
        if kind is not None:
            try:
                routing = RoutingType(kind.upper())
            except ValueError:
                raise InvalidField(
                    f"destination-type {kind!r}: expected ANYCAST or MULTICAST"
                ) from None
        if not address:
            raise InvalidField(f"destination {destination!r} names no address")
        return address, routing
