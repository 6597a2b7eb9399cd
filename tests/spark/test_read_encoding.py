"""Stream deliveries to Arrow rows (`schema.to_batch`), for what a client may have sent."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from scow.plugins.spark import records  # noqa: E402
from scow.plugins.spark.schema import to_batch  # noqa: E402
from tests.system.poison import payloads  # noqa: E402


def test_a_malformed_message_is_an_unreadable_row_not_a_failed_batch():
    """A message whose sections are nonsense (the broker took it as bytes) failed the
    whole batch, so the query failed on every retry: one bad record stopped a pipeline."""
    delivered = [
        records.annotate(data, seq, 1_700_000_000_000 + seq)
        for seq, data in enumerate(payloads(60, 11))
    ]
    batch = to_batch("s", delivered).to_pydict()
    assert batch["sequence"] == list(range(60))
    kinds = batch["body_type"]
    unreadable = [i for i, kind in enumerate(kinds) if kind == "unreadable"]
    assert unreadable, kinds
    assert all(batch["body"][i] == delivered[i] for i in unreadable)
    good = [i for i in range(0, 60, 10)]
    assert [batch["body"][i] for i in good] == [f"good {i}".encode() for i in good]
    assert all(batch["application_properties"][i] == [("color", "red")] for i in good)
