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


def _credit(t: float, n: int) -> dict[str, Any]:
    return {"kind": "credit", "queue": LVQ, "n": n, "t": t, "client": "c1"}


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
        _credit(2.0, 10),
        _delivered("p:2143", 3.0),
    ]
    assert _last_value_findings(events) == []


def test_a_value_handed_out_after_a_later_one_of_its_key_is_flagged() -> None:
    events = [
        _sent("p", 10, 1.0, "k2", durable=True),
        _sent("p", 11, 1.1, "k2", durable=True),
        _credit(2.0, 10),
        _delivered("p:10", 3.0),
    ]
    [finding] = _last_value_findings(events)
    assert finding.startswith("[last-value]") and "p:10" in finding and "p:11" in finding


def test_between_producers_the_acknowledgement_order_decides() -> None:
    events = [
        _sent("p", 10, 1.0, "k2", durable=True),
        _sent("q", 3, 1.1, "k2", durable=True),
        _credit(2.0, 10),
        _delivered("p:10", 3.0),
    ]
    assert len(_last_value_findings(events)) == 1


def test_a_value_logged_late_on_credit_granted_before_the_later_one_is_not_flagged() -> None:
    """Found by a soak on a loaded machine: three values of one key accepted within a
    millisecond, logged by one consumer together a second later; it had credit for them
    all before the first came, so the broker may have sent each as it arrived."""
    events = [
        _credit(0.5, 10),
        _sent("p", 5175, 1.0, "k2", durable=True),
        _sent("p", 5183, 1.0003, "k2", durable=True),
        _sent("p", 5184, 1.0004, "k2", durable=True),
        _delivered("p:5175", 2.05),
        _delivered("p:5183", 2.0501),
        _delivered("p:5184", 2.0502),
    ]
    assert _last_value_findings(events) == []


def test_each_delivery_takes_the_next_unit_of_credit() -> None:
    """The second delivery needed the credit granted after the later value came."""
    events = [
        _credit(0.5, 1),
        _sent("p", 1, 0.6, "k1", durable=True),
        _delivered("p:1", 0.7),
        _sent("p", 10, 1.0, "k2", durable=True),
        _sent("p", 11, 1.1, "k2", durable=True),
        _credit(2.0, 1),
        _delivered("p:10", 2.1),
    ]
    [finding] = _last_value_findings(events)
    assert "p:10" in finding and "on credit granted 0.900s after p:11" in finding
    events[0]["n"] = 2  # credit for both before either came: p:10 may have left at once
    assert _last_value_findings(events) == []
