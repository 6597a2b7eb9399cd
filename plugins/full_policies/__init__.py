"""Address-full policies DROP, FAIL and BLOCK (PAGE comes with the paging plugin).

An address is full once it holds `max-size-bytes` (or `max-size-messages`), or the broker
as a whole holds `global-max-size` (or `global-max-messages`); the policy then decides
what happens to each new message.
"""

from __future__ import annotations

from scow.core import hookimpl
from scow.core.descriptors import FullPolicyType
from scow.core.message import Message
from scow.core.model import AddressInfo


class Drop:
    """Accept and silently discard messages while full."""

    def __init__(self, address: AddressInfo, broker: object = None) -> None:
        self.address = address

    def admit(self, message: Message) -> bool | None:
        return False

    def blocks_producers(self) -> bool:
        return False


class Fail(Drop):
    """Refuse messages while full: the producer gets an error outcome."""

    def admit(self, message: Message) -> bool | None:
        return None


class Block(Drop):
    """Stop crediting producers while full; messages already in flight are accepted."""

    def admit(self, message: Message) -> bool | None:
        return True

    def blocks_producers(self) -> bool:
        return self.address.is_full()


@hookimpl
def scow_register_full_policies() -> list[FullPolicyType]:
    return [
        FullPolicyType("DROP", Drop, "discard new messages while the address is full"),
        FullPolicyType("FAIL", Fail, "refuse new messages (producer error) while full"),
        FullPolicyType("BLOCK", Block, "give producers no credit while the address is full"),
    ]
