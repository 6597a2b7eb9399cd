"""The chaos checker's own rules, on hand-made histories (no broker): an oracle that
flags what the broker did right sends the schedules chasing ghosts."""

from __future__ import annotations

from typing import Any

from tests.system.checker import Checker, History
from tests.system.topology import LANES

LVQ = LANES["lvq"].address


def _sent(client: str, seq: int, t: float, key: str, durable: bool) -> dict[str, Any]:
    return {
        "kind": "sent",
        "lane": "lvq",
        "client": client,
        "id": f"{client}:{seq}",
        "seq": seq,
        "t": t,
        "k": key,
        "durable": durable,
    }


def _delivered(ident: str, t: float) -> dict[str, Any]:
    return {"kind": "delivered", "queue": LVQ, "id": ident, "t": t, "count": 0, "client": "c1"}


def _last_value_findings(events: list[dict[str, Any]]) -> list[str]:
    checker = Checker(History(events))
    accepted = {e["id"]: e for e in events if e["kind"] == "sent"}
    checker.check_last_values(accepted)
    return [str(v) for v in checker.f.violations]


def test_a_durable_value_acknowledged_after_a_later_non_durable_one_did_not_replace_it() -> None:
    """Found by a soak: p:2140 (durable) was acknowledged after p:2143 (not durable, sent
    later on the same link), so by acknowledgement time 2140 looked newer than 2143."""
    events = [
        _sent("p", 2143, 1.0, "k2", durable=False),
        _sent("p", 2140, 1.2, "k2", durable=True),
        _delivered("p:2143", 3.0),
    ]
    assert _last_value_findings(events) == []


def test_a_value_handed_out_after_a_later_one_of_its_key_is_flagged() -> None:
    events = [
        _sent("p", 10, 1.0, "k2", durable=True),
        _sent("p", 11, 1.1, "k2", durable=True),
        _delivered("p:10", 3.0),
    ]
    [finding] = _last_value_findings(events)
    assert finding.startswith("[last-value]") and "p:10" in finding and "p:11" in finding


def test_between_producers_the_acknowledgement_order_decides() -> None:
    events = [
        _sent("p", 10, 1.0, "k2", durable=True),
        _sent("q", 3, 1.1, "k2", durable=True),
        _delivered("p:10", 3.0),
    ]
    assert len(_last_value_findings(events)) == 1
