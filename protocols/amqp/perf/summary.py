"""The figures of a `scow perf client` run: from the reports of its processes to the
summary, its printed form, and whether the run did all it set out to."""

from __future__ import annotations

import array
import math
from typing import Any

_PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p99.9", 0.999))


def percentiles(latencies_ns: array.array[int]) -> dict[str, float]:
    """p50/p90/p99/p99.9/max of nanosecond latencies, in milliseconds."""
    if not latencies_ns:
        return {name: math.nan for name, _ in _PERCENTILES} | {"max": math.nan}
    ordered = sorted(latencies_ns)
    n = len(ordered)
    out = {
        name: ordered[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6 for name, q in _PERCENTILES
    }
    out["max"] = ordered[-1] / 1e6
    return out


def summarize(
    producers: list[dict[str, Any]], consumers: list[dict[str, Any]], options: dict[str, Any]
) -> dict[str, Any]:
    """The run's figures from the per-connection reports of both processes.

    A side that did not run (`--mode send` or `receive`) reports no list, and its keys
    are None rather than 0: "received 0" would read as a failure to receive.
    """
    pairs = options["pairs"]
    count = options["count"] * pairs
    outcomes: dict[str, int] = {}
    for p in producers:
        for name, n in p["outcomes"].items():
            outcomes[name] = outcomes.get(name, 0) + n
    latencies: array.array[int] = array.array("q")
    for c in consumers:
        latencies.frombytes(c["latencies"])

    def rate(reports: list[dict[str, Any]]) -> float | None:
        if not reports:
            return None
        start = min(r["from_ns"] for r in reports)
        end = max(r["to_ns"] for r in reports)
        return round(count / ((end - start) / 1e9), 1) if end > start else math.nan

    def total(reports: list[dict[str, Any]], key: str) -> int | None:
        return sum(r[key] for r in reports) if reports else None

    start = min(r["from_ns"] for r in producers + consumers)
    end = max(r["to_ns"] for r in producers + consumers)
    return {
        "pairs": pairs,
        "size": options["size"],
        "durable": options["durable"],
        "presettled": options["presettled"],
        "rate_target": options["rate"] or None,
        "count": count,
        "warmup": options["warmup"] * pairs,
        "sent": total(producers, "sent"),
        "outcomes": {k: v for k, v in outcomes.items() if v} if producers else None,
        "received": total(consumers, "received"),
        "unstamped": total(consumers, "unstamped"),
        "mode": options["mode"],
        "send_rate": rate(producers),
        "receive_rate": rate(consumers),
        "elapsed_s": round((end - start) / 1e9, 3),
        # stamps from another run mean nothing: latency only when this run sent them
        "latency_ms": {k: round(v, 3) for k, v in percentiles(latencies).items()}
        if producers and consumers
        else None,
    }


def format_summary(result: dict[str, Any]) -> str:
    """The summary as the readable block `scow perf client` prints; absent figures left out."""
    mode = "pre-settled" if result["presettled"] else "at-least-once"
    if result["durable"]:
        mode += ", durable"
    pace = f", paced at {result['rate_target']:.0f} msg/s" if result["rate_target"] else ""
    who = {"pairs": "pair(s)", "send": "producer(s) only", "receive": "consumer(s) only"}
    lines = [
        f"scow perf client: {result['pairs']} {who[result['mode']]}, "
        f"{result['size']} B bodies, {mode}{pace}",
        f"  messages      {result['count']} measured, {result['warmup']} warm-up",
    ]
    if result["sent"] is not None:
        outcomes = ", ".join(f"{v} {k}" for k, v in result["outcomes"].items())
        lines.append(f"  sent          {result['sent']} ({outcomes or 'pre-settled'})")
    if result["received"] is not None:
        lines.append(f"  received      {result['received']}")
    for label, key in (("send rate", "send_rate"), ("receive rate", "receive_rate")):
        if result[key] is not None:
            lines.append(f"  {label:<12}  {result[key]:>10.0f} msg/s")
    lat = result["latency_ms"]
    if lat is not None:
        lines.append(
            "  latency (ms)  "
            + "  ".join(f"{n} {lat[n]:.3f}" for n in ("p50", "p90", "p99", "p99.9", "max"))
        )
    lines.append(f"  elapsed       {result['elapsed_s']:.3f} s")
    if result["unstamped"]:
        lines.append(f"  unstamped     {result['unstamped']} messages had no readable send time")
    return "\n".join(lines)


def completed(result: dict[str, Any]) -> bool:
    """Whether the run did all it set out to: every message received, or sent and accepted.

    A send-only run has no consumer to count on, so at-least-once it counts the accepted
    outcomes (a rejected message was sent but is not on the queue); pre-settled there are
    no outcomes and sending is all it can know.
    """
    expected = result["count"] + result["warmup"]
    if result["mode"] != "send":
        return bool(result["received"] >= expected)
    if result["presettled"]:
        return bool(result["sent"] >= expected)
    return bool(result["outcomes"].get("accepted", 0) >= expected)
