"""The process's open-file limit, and the share of it that client sockets may take.

Every client socket is a file descriptor, and so is every journal, page, stream and
large-message file the broker opens. Left alone, a storm of connections (many clients at
once, a reconnect loop, sockets that never speak) could take every descriptor the process
may open: the journal could then not make its next file, and nothing more could be stored.
So client sockets get the limit less a reserve (`reserve`), and a socket beyond that is
closed as soon as it is accepted (`scow.core.security.Security.take_socket`).

`scow run` first raises its soft limit to the hard one, as a JVM does at start: the soft
limit a login shell hands out (often 1024) is a default, not a choice.
"""

from __future__ import annotations

import contextlib
import resource

#: Descriptors kept from client sockets, at the least (files, logs, the event loop's own,
#: a database's connections) and as a share of the limit.
RESERVE_MIN = 100
RESERVE_PERCENT = 10

#: Where the soft limit is raised to when the hard one is unlimited (Linux refuses more
#: than its `fs.nr_open`, whose default this is).
_UNLIMITED = 1 << 20


def limit() -> int:
    """The soft open-file limit of this process."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _UNLIMITED if soft == resource.RLIM_INFINITY else soft


def raise_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; (before, after)."""
    before = limit()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    target = _UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if before < target:
        with contextlib.suppress(ValueError, OSError):  # refused: keep what we were given
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return before, limit()


def reserve(files: int) -> int:
    """Descriptors of a limit of `files` that client sockets may not take (at most half)."""
    return min(max(RESERVE_MIN, files * RESERVE_PERCENT // 100), files // 2)


def socket_ceiling(files: int) -> int:
    """Client sockets that may be open at once under an open-file limit of `files`."""
    return files - reserve(files)
