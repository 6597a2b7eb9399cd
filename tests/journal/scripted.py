"""A scripted journal history as JSON-friendly operations.

Plain module (no package-relative imports) so a crash-test child process can import it
and replay exactly the operations the parent feeds into its model.
"""

from __future__ import annotations

from typing import Any

Op = list[Any]


def apply(journal: Any, model: Any, ops: list[Op]) -> None:
    """Run `ops` against `journal` and, when given, the reference `model`."""
    for op in ops:
        kind, args = op[0], op[1:]
        if kind == "add":
            rid, rtype, data = args[0], args[1], args[2].encode("latin-1")
            journal.append_add(rid, rtype, data, sync=False)
            if model:
                model.add(rid, rtype, data)
        elif kind == "update":
            rid, rtype, data, repl = args[0], args[1], args[2].encode("latin-1"), args[3]
            journal.append_update(rid, rtype, data, sync=False, replaceable=repl)
            if model:
                model.update(rid, rtype, data, repl)
        elif kind == "delete":
            journal.append_delete(args[0], sync=False)
            if model:
                model.delete(args[0])
        elif kind == "add_tx":
            tx, rid, rtype, data = args[0], args[1], args[2], args[3].encode("latin-1")
            journal.append_add_tx(tx, rid, rtype, data)
            if model:
                model.tx(tx, "add", rid, rtype, data)
        elif kind == "update_tx":
            tx, rid, rtype, data = args[0], args[1], args[2], args[3].encode("latin-1")
            journal.append_update_tx(tx, rid, rtype, data)
            if model:
                model.tx(tx, "update", rid, rtype, data)
        elif kind == "delete_tx":
            journal.append_delete_tx(args[0], args[1])
            if model:
                model.tx(args[0], "delete", args[1])
        elif kind == "prepare":
            journal.prepare(args[0], args[1].encode("latin-1"), sync=False)
            if model:
                model.prepared[args[0]] = args[1].encode("latin-1")
        elif kind == "commit":
            journal.commit(args[0], sync=False)
            if model:
                model.commit(args[0])
        elif kind == "rollback":
            journal.rollback(args[0], sync=False)
            if model:
                model.rollback(args[0])
        else:
            raise AssertionError(f"unknown op {op}")


def history() -> list[Op]:
    """Many files, most records dead, a few long-lived ones with updates, and
    transactions (committed, prepared, open) with records spread over old files."""
    ops: list[Op] = []
    big = "x" * 900
    ops += [["add_tx", 7, 5000, 3, "prepared-in-old-file"], ["update_tx", 7, 1, 4, "ack"]]
    for i in range(1, 401):
        ops.append(["add", i, 1, big])
        if i % 40 == 1:
            ops.append(["update", i, 34, f"count=1 of {i}", True])
            ops.append(["update", i, 32, f"ref of {i}", False])
    ops += [["add_tx", 8, 5001, 3, "open-across-compaction"], ["delete_tx", 8, 41]]
    ops += [["prepare", 7, "xid-7"]]
    for i in range(1, 401):
        if i % 40 != 1:
            ops.append(["delete", i])
        else:
            ops.append(["update", i, 34, f"count=2 of {i}", True])
    ops += [["add_tx", 9, 5002, 3, "committed"], ["commit", 9]]
    ops += [["add_tx", 10, 5003, 3, "prepared then rolled back"], ["prepare", 10, "xid-10"]]
    return ops


def during() -> list[Op]:
    """What happens while the compactor works: every kind of change to old records."""
    return [
        ["delete", 81],  # a copied record dies
        ["update", 121, 34, "count=3 during", True],  # supersedes a copied update
        ["update", 161, 32, "new ref during", False],
        ["commit", 8],  # open transaction with copied records commits
        ["rollback", 10],  # prepared transaction with copied records rolls back
        ["add", 9001, 1, "added during compaction"],
        ["add_tx", 11, 9002, 1, "tx during"],
        ["commit", 11],
    ]
