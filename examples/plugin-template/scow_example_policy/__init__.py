"""DROP_NON_DURABLE: a full address drops non-durable messages and refuses durable ones.

A producer of durable messages hears that the address is full (its send is rejected), so
nothing it cares about disappears silently; non-durable traffic is shed quietly, as the
DROP policy would.
"""

from __future__ import annotations

from scow.core import AddressInfo, Broker, FullPolicyType, Message, hookimpl

#: The Scow hook API versions this plugin is written for.
SCOW_HOOK_API = ">=1.0,<2"


class DropNonDurable:
    """The policy of one address (the broker asks it only while the address is full)."""

    def __init__(self, address: AddressInfo, broker: Broker) -> None:
        self.address = address

    def admit(self, message: Message) -> bool | None:
        """False drops the message silently; None refuses it (the producer gets an error)."""
        return None if message.durable else False

    def blocks_producers(self) -> bool:
        return False


@hookimpl
def scow_register_full_policies() -> list[FullPolicyType]:
    return [
        FullPolicyType(
            "DROP_NON_DURABLE",
            DropNonDurable,
            "while full, drop non-durable messages and refuse durable ones",
        )
    ]
