"""The invariants a schedule must keep, checked on what the clients and the drain recorded.

- Every message the broker accepted is handed out by each queue it was routed to: acked
  by a consumer, committed in a consumer's transaction, printed by the C receiver, or
  taken by the final drain (its dead-letter or expiry copy counts for its queue).
  Exceptions the traffic makes computable: a non-durable message when the broker was
  killed after accepting it, a last-value message replaced by a later one with its key,
  a transaction whose commit was in doubt (all of it or none).
- No message is delivered for the first time (delivery count 0) twice by one queue while
  one broker process lived (a restart may repeat deliveries the journal had not counted).
- Per consumer and FIFO queue, first deliveries of one producer arrive in send order.
- A last-value queue never hands out a value a later one of its key had replaced: one
  whose delivery needed credit its consumer granted after the later value was accepted.
- Selector consumers get only matching messages; large messages arrive intact; nothing of
  an aborted or unfinished transaction, or of a send cut off mid-message, is delivered.
- A stream keeps every accepted message once, in sequence, per producer in send order.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.system.topology import C_SEND_ADDRESS, LANES

DELIVERY_KINDS = ("delivered", "drained")
#: Seconds one producer's acknowledgements may come out of send order (a durable send's
#: waits for its sync; a later non-durable one's does not).
ACK_REORDER = 10.0
SECONDARY = ("DLA", "ExpiryQueue")


@dataclass
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.detail}"


@dataclass
class History:
    """Everything recorded during one schedule."""

    events: list[dict[str, Any]]
    #: Broker restarts: (time the old process was killed, time the new one listened).
    restarts: list[tuple[float, float]] = field(default_factory=list)
    #: ids printed by proton's C receive, per receive process.
    printed: dict[str, list[str]] = field(default_factory=dict)
    #: Clients the schedule killed, stopped or that reset their own connection.
    crashed: set[str] = field(default_factory=set)
    #: proton C send runs: (messages asked for, whether it reported them all acknowledged,
    #: when it ended). Its messages are not durable.
    c_sends: list[tuple[int, bool, float]] = field(default_factory=list)
    lanes: tuple[str, ...] = tuple(LANES)


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    accepted: int = 0
    lost: int = 0
    duplicated: int = 0
    in_doubt: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, detail))


def _queue_key(event: dict[str, Any]) -> str:
    """The queue a delivery counts for: a dead-letter or expiry copy counts for the queue
    it came from (one id may be dead-lettered from each subscription)."""
    queue = str(event.get("queue"))
    if queue in SECONDARY and event.get("orig_queue"):
        return f"{queue}<-{event['orig_queue']}"
    return queue


def _home(event: dict[str, Any]) -> str:
    queue = str(event.get("queue"))
    if queue in SECONDARY and event.get("orig_queue"):
        return str(event["orig_queue"])
    return queue


Link = tuple[str, str, str | None]


def _link(event: dict[str, Any]) -> Link:
    """A receiving link, as events name it: client, queue, selector."""
    return event["client"], event["queue"], event.get("selector")


class _Credit:
    """The credit each link was granted (its client's `credit` events), handed out to its
    deliveries in order: a link's n-th delivery takes the n-th unit of credit."""

    def __init__(self, events: Iterable[dict[str, Any]]) -> None:
        #: per link: the credit granted so far after each grant, and the grant's time
        self.totals: dict[Link, list[int]] = defaultdict(list)
        self.times: dict[Link, list[float]] = defaultdict(list)
        for e in events:
            totals = self.totals[_link(e)]
            totals.append((totals[-1] if totals else 0) + e["n"])
            self.times[_link(e)].append(e["t"])
        self.taken: dict[Link, int] = defaultdict(int)

    def take(self, delivery: dict[str, Any]) -> float | None:
        """When the credit that `delivery` took was granted (None: not logged)."""
        link = _link(delivery)
        self.taken[link] += 1
        totals = self.totals.get(link, [])
        grant = bisect.bisect_left(totals, self.taken[link])
        return self.times[link][grant] if grant < len(totals) else None


def _arrived_after(value: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether `value` reached the broker after `other`. One producer's link delivers in
    send order, though a durable send is acknowledged after a later non-durable one (it
    waits for the sync); between producers the acknowledgements are all there is."""
    if value["client"] == other["client"] and "seq" in value and "seq" in other:
        return bool(value["seq"] > other["seq"])
    return bool(value["t"] > other["t"])


class Checker:
    def __init__(self, history: History) -> None:
        self.h = history
        self.f = Findings()
        self.by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in history.events:
            self.by_kind[event["kind"]].append(event)
        self.readies = [r for _, r in history.restarts]

    def epoch(self, t: float) -> int:
        """Which broker process served at `t` (a delivery logged between a kill and the
        restart came from the old one)."""
        return sum(1 for ready in self.readies if ready <= t)

    def killed_after(self, t: float) -> bool:
        """A broker process that may have held what was logged at `t` was killed later (a
        client logs an acceptance a moment after it arrives: until the restarted broker
        listens, what is logged came from the killed one)."""
        return any(ready > t for ready in self.readies)

    # ------------------------------------------------------------------ accepted

    def accepted(self) -> tuple[dict[str, dict[str, dict]], dict[str, set[str]], set[str]]:
        """Per lane, accepted id -> its `sent` event; in-doubt transaction batches; ids of
        transactions that never committed."""
        accepted: dict[str, dict[str, dict]] = defaultdict(dict)
        for e in self.by_kind["sent"]:
            accepted[e["lane"]][e["id"]] = e
        outcome: dict[tuple[str, int], str] = {}
        for kind in ("tx-committed", "tx-aborted", "tx-commit-failed"):
            for e in self.by_kind[kind]:
                if "batch" in e:
                    outcome[(e["client"], e["batch"])] = kind
        doubtful: dict[str, set[str]] = {}
        never: set[str] = set()
        discharged: dict[tuple[str, int], dict] = {
            (e["client"], e["batch"]): e for e in self.by_kind["tx-discharge"] if "queue" not in e
        }
        for e in self.by_kind["tx-begin"]:
            key = (e["client"], e["batch"])
            result = outcome.get(key)
            discharge = discharged.get(key)
            if result == "tx-committed":
                for ident in e["ids"]:
                    accepted[e["lane"]][ident] = {**e, "id": ident, "durable": True}
            elif result is None and discharge is not None and discharge["commit"]:
                doubtful[f"{e['client']}#{e['batch']}"] = set(e["ids"])
            else:
                never.update(e["ids"])
        return accepted, doubtful, never

    # ------------------------------------------------------------------ checks

    def run(self) -> Findings:
        accepted, doubtful, never = self.accepted()
        self.f.accepted = sum(len(ids) for ids in accepted.values())
        self.f.in_doubt = sum(len(ids) for ids in doubtful.values())
        covered = self.covered()
        seen = self.seen()
        for name in self.h.lanes:
            lane = LANES[name]
            if name == "stream":
                self.check_stream(accepted.get(name, {}))
                continue
            for queue in lane.queues:
                self.check_coverage(lane.name, queue, accepted.get(name, {}), covered, seen)
        self.check_transactions(doubtful, never, seen)
        self.check_first_deliveries()
        self.check_order()
        self.check_content()
        self.check_last_values(accepted.get("lvq", {}))
        self.check_c_sends()
        self.f.counts = {k: len(v) for k, v in self.by_kind.items()}
        return self.f

    def covered(self) -> dict[str, set[str]]:
        """Per queue, the ids it handed out for good."""
        covered: dict[str, set[str]] = defaultdict(set)
        for e in self.by_kind["acked"]:
            covered[e["queue"]].update(e["ids"])
        committed_or_doubt: dict[tuple[str, int], dict] = {}
        for e in self.by_kind["tx-discharge"]:
            if "queue" in e and e["commit"]:
                committed_or_doubt[(e["client"], e["batch"])] = e
        aborted = {
            (e["client"], e.get("batch"))
            for e in self.by_kind["tx-aborted"] + self.by_kind["tx-commit-failed"]
            if "queue" in e
        }
        for key, e in committed_or_doubt.items():
            if key not in aborted:  # committed, or in doubt: either way not for the checker
                covered[e["queue"]].update(e["ids"])
        for e in self.by_kind["drained"]:
            covered[_home(e)].add(e["id"])
        for ids in self.h.printed.values():
            covered[LANES["c"].address].update(ids)
        return covered

    def seen(self) -> dict[str, list[dict]]:
        """Every delivery of each id, anywhere."""
        seen: dict[str, list[dict]] = defaultdict(list)
        for kind in ("delivered", "drained", "read"):
            for e in self.by_kind[kind]:
                seen[e["id"]].append(e)
        for client, ids in self.h.printed.items():
            for ident in ids:
                seen[ident].append({"client": client, "kind": "printed", "queue": "sys.c"})
        return seen

    def check_coverage(
        self,
        lane: str,
        queue: str,
        accepted: dict[str, dict],
        covered: dict[str, set[str]],
        seen: dict[str, list[dict]],
    ) -> None:
        got = covered.get(queue, set())
        newest: dict[str, float] = {}
        #: (producer, key) -> the highest seq of a value of that key handed out: one sent
        #: later by the same producer, even if it never heard it was accepted (in doubt)
        later: dict[tuple[str, str], int] = {}
        if lane == "lvq":
            for e in accepted.values():
                newest[e["k"]] = max(newest.get(e["k"], 0.0), e["t"])
            for e in (e for events in seen.values() for e in events):
                if _home(e) == queue and "k" in e and e.get("seq") is not None:
                    slot = (e["producer"], e["k"])
                    later[slot] = max(later.get(slot, -1), e["seq"])
        lost = []
        for ident, sent in accepted.items():
            if ident in got:
                continue
            if not sent.get("durable", True) and self.killed_after(sent["t"]):
                continue  # a non-durable message does not outlive the broker process
            if lane == "lvq" and (
                sent["t"] < newest[sent["k"]]
                or later.get((ident.rpartition(":")[0], sent["k"]), -1) > sent["seq"]
            ):
                continue  # replaced by a later message with its key
            lost.append(ident)
        self.f.lost += len(lost)
        for ident in lost[:10]:
            where = [
                f"{e['kind']} to {e['client']} (count {e.get('count')})"
                + (" [crashed]" if e["client"] in self.h.crashed else "")
                for e in seen.get(ident, [])
                if _home(e) == queue
            ]
            self.add_lost(lane, queue, ident, accepted[ident], where)
        if len(lost) > 10:
            self.f.add("lost", f"{queue}: ... and {len(lost) - 10} more accepted messages lost")

    def add_lost(self, lane: str, queue: str, ident: str, sent: dict, where: list[str]) -> None:
        durable = "durable" if sent.get("durable", True) else "non-durable"
        history = "; ".join(where) if where else "never delivered"
        self.f.add(
            "lost",
            f"{queue} (lane {lane}): accepted {durable} message {ident} at {sent['t']:.3f} "
            f"was not handed out: {history}",
        )

    def check_transactions(
        self, doubtful: dict[str, set[str]], never: set[str], seen: dict[str, list[dict]]
    ) -> None:
        for ident in sorted(never):
            if seen.get(ident):
                first = seen[ident][0]
                self.f.add(
                    "uncommitted-delivered",
                    f"{ident} was sent in a transaction that never committed, yet "
                    f"{first['kind']} to {first['client']} from {first.get('queue')}",
                )
        for batch, ids in doubtful.items():
            present = {i for i in ids if seen.get(i)}
            if present and present != ids:
                self.f.add(
                    "tx-atomicity",
                    f"transaction {batch} (commit in doubt): {len(present)} of {len(ids)} "
                    f"messages delivered ({sorted(present)[:5]}), the others never",
                )

    def check_first_deliveries(self) -> None:
        firsts: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for kind in DELIVERY_KINDS:
            for e in self.by_kind[kind]:
                if e.get("count") == 0 and e.get("lane") not in (None, "stream"):
                    firsts[(_queue_key(e), e["id"])].append(e)
        for (queue, ident), events in sorted(firsts.items()):
            by_epoch: dict[int, list[dict]] = defaultdict(list)
            for e in events:
                by_epoch[self.epoch(e["t"])].append(e)
            for epoch, same in by_epoch.items():
                if len(same) > 1:
                    self.f.duplicated += len(same) - 1
                    if self.f.duplicated <= 10 + len(same):
                        who = ", ".join(
                            f"{e['kind']} to {e['client']} at {e['t']:.3f}"
                            + (" [crashed]" if e["client"] in self.h.crashed else "")
                            for e in same
                        )
                        self.f.add(
                            "duplicate-first-delivery",
                            f"{queue}: {ident} delivered with delivery-count 0 "
                            f"{len(same)} times by broker process #{epoch}: {who}",
                        )

    def check_order(self) -> None:
        streams: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
        for kind in DELIVERY_KINDS:
            for e in self.by_kind[kind]:
                lane = LANES.get(str(e.get("lane")))
                if lane is None or not lane.fifo or lane.name in ("stream", "c"):
                    continue
                if e.get("count") != 0 or e.get("producer") is None or e["queue"] in SECONDARY:
                    continue
                # one consumer is one link: a client's selector links are two consumers
                consumer = f"{e['client']}" + (f"[{e['selector']}]" if e.get("selector") else "")
                streams[(consumer, e["queue"], e["producer"])].append(e)
        bad = 0
        for (client, queue, _producer), events in sorted(streams.items()):
            last = None
            for e in events:
                if last is not None and e["seq"] <= last["seq"]:
                    bad += 1
                    if bad <= 10:
                        self.f.add(
                            "order",
                            f"{queue}: {client} got {e['id']} (first delivery) after "
                            f"{last['id']} from the same producer",
                        )
                    break
                last = e

    def check_content(self) -> None:
        for kind in DELIVERY_KINDS:
            for e in self.by_kind[kind]:
                if e.get("selector") and e.get("color") != e["selector"]:
                    self.f.add(
                        "selector",
                        f"{e['client']} with selector color = '{e['selector']}' got "
                        f"{e['id']} whose color is {e.get('color')!r}",
                    )
                if e.get("intact") is False:
                    self.f.add("corrupt", f"{e['id']} arrived at {e['client']} damaged")
                if str(e.get("id", "")).endswith(":partial"):
                    self.f.add(
                        "partial-delivered",
                        f"{e['id']}, whose sender died mid-message, was delivered to {e['client']}",
                    )

    def check_last_values(self, accepted: dict[str, dict]) -> None:
        """A last-value queue hands out no value that a later one with its key had
        replaced, in memory or in pages, while one broker process lives.

        A consumer logs a value when it gets round to it, which on a loaded machine can
        be seconds after the broker sent it; so a value counts as replaced only when the
        broker provably sent it after the later one was accepted: its delivery needed
        credit that its consumer granted (a `credit` event, logged before the flow goes
        out) after that. Deliveries to a client that logs no credit are not judged."""
        values: dict[str, list[dict]] = defaultdict(list)
        for e in accepted.values():
            values[e["k"]].append(e)
        for key_values in values.values():
            key_values.sort(key=lambda e: e["t"])
        accepted_at = {k: [v["t"] for v in key_values] for k, key_values in values.items()}
        # the first time each value was handed out (a value that was out with a consumer
        # when a later one came is not replaced: it comes back if that consumer fails, with
        # a delivery count of 0 when a restart came between), and when the credit it took
        # was granted
        first: dict[str, tuple[dict, float]] = {}
        credit = _Credit(self.by_kind["credit"])
        for kind in DELIVERY_KINDS:
            for e in self.by_kind[kind]:
                if e["queue"] != LANES["lvq"].address:
                    continue
                granted = credit.take(e)
                if e["id"] not in accepted or granted is None:
                    continue
                if e["id"] not in first or e["t"] < first[e["id"]][0]["t"]:
                    first[e["id"]] = (e, granted)
        stale = 0
        for e, granted in sorted(first.values(), key=lambda pair: pair[0]["t"]):
            sent = accepted[e["id"]]
            if e.get("count") != 0 or self.epoch(sent["t"]) != self.epoch(e["t"]):
                # out with a consumer before (or perhaps, unlogged, before a restart): it
                # comes back; test_faults checks what a restart does to replaced values
                continue
            # the values accepted before the credit came, from a while before `sent` on
            # (`_arrived_after`: an earlier acknowledgement may be of a later send)
            times = accepted_at[sent["k"]]
            since = bisect.bisect_left(times, sent["t"] - ACK_REORDER)
            until = bisect.bisect_left(times, granted)
            newer = next(
                (
                    v
                    for v in values[sent["k"]][since:until]
                    if _arrived_after(v, sent)
                    and (v.get("durable", True) or self.epoch(v["t"]) == self.epoch(e["t"]))
                ),
                None,
            )
            if newer is not None:
                stale += 1
                if stale <= 5:
                    self.f.add(
                        "last-value",
                        f"{e['queue']}: {e['id']} (key {sent['k']}) {e['kind']} to "
                        f"{e['client']} on credit granted {granted - newer['t']:.3f}s after "
                        f"{newer['id']}, a later value of its key, was accepted",
                    )
        if stale > 5:
            self.f.add("last-value", f"... and {stale - 5} more replaced values handed out")

    def check_stream(self, accepted: dict[str, dict]) -> None:
        read = [e for e in self.by_kind["drained"] if e.get("lane") == "stream"]
        ids = [e["id"] for e in read]
        counts: dict[str, int] = defaultdict(int)
        for ident in ids:
            counts[ident] += 1
        twice = sorted(i for i, n in counts.items() if n > 1)
        if twice:
            self.f.add("stream", f"the stream holds {len(twice)} messages twice: {twice[:5]}")
        missing = sorted(set(accepted) - set(ids), key=lambda i: accepted[i]["t"])
        self.f.lost += len(missing)
        for ident in missing[:10]:
            self.add_lost("stream", "sys.stream", ident, accepted[ident], ["not in the stream"])
        if len(missing) > 10:
            self.f.add("lost", f"sys.stream: ... and {len(missing) - 10} more missing")
        sequences = [e.get("sequence") for e in read]
        if any(s is None for s in sequences) or sequences != sorted(set(sequences)):
            self.f.add("stream", "sequence numbers read from first are not strictly increasing")
        self._per_producer_order(read, "sys.stream (read from first)")
        for client, events in _by_client(self.by_kind["read"]).items():
            blank = [e["id"] for e in events if e.get("sequence") is None]
            if blank:
                self.f.add(
                    "stream",
                    f"reader {client} got {len(blank)} messages without x-opt-sequence-number "
                    f"(ids {blank[:5]}): not records of the stream",
                )
            seqs = [e["sequence"] for e in events if e.get("sequence") is not None]
            if seqs != sorted(set(seqs)):
                self.f.add("stream", f"reader {client} saw sequence numbers out of order")

    def _per_producer_order(self, events: Iterable[dict], where: str) -> None:
        last: dict[str, int] = {}
        for e in events:
            producer, seq = e.get("producer"), e.get("seq")
            if producer is None or seq is None:
                continue
            if seq <= last.get(producer, -1):
                self.f.add("order", f"{where}: {e['id']} after seq {last[producer]}")
                return
            last[producer] = seq

    def check_c_sends(self) -> None:
        expected = sum(n for n, done, t in self.h.c_sends if done and not self.killed_after(t))
        if not self.h.c_sends:
            return
        got = sum(1 for e in self.by_kind["drained"] if e.get("queue") == C_SEND_ADDRESS)
        if got < expected:
            self.f.lost += expected - got
            self.f.add(
                "lost",
                f"{C_SEND_ADDRESS}: proton's C send reported {expected} messages acknowledged; "
                f"the queue held {got}",
            )


def _by_client(events: Iterable[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        grouped[e["client"]].append(e)
    return grouped


def check(history: History) -> Findings:
    return Checker(history).run()
