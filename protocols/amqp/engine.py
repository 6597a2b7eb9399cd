"""The one module that calls proton's C engine (`cproton_ffi.lib`).

proton's Transport and Connection are a sans-IO AMQP 1.0 state machine: bytes in, bytes
and events out. Built against python-qpid-proton 0.40 (pinned in pyproject).

Per-message calls are re-exported as the bare cffi functions (a Python wrapper would
double their cost); setup calls, done once per connection or link, get small wrappers
that take and return Python values. Pointers are cffi cdata: hashable, false when NULL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from cproton_ffi import ffi, lib

from scow.protocols.amqp import codec

CData = Any  # a cffi pointer

# --------------------------------------------------------------------------- event types

CONNECTION_REMOTE_OPEN = lib.PN_CONNECTION_REMOTE_OPEN
CONNECTION_REMOTE_CLOSE = lib.PN_CONNECTION_REMOTE_CLOSE
SESSION_REMOTE_OPEN = lib.PN_SESSION_REMOTE_OPEN
SESSION_REMOTE_CLOSE = lib.PN_SESSION_REMOTE_CLOSE
LINK_REMOTE_OPEN = lib.PN_LINK_REMOTE_OPEN
LINK_REMOTE_CLOSE = lib.PN_LINK_REMOTE_CLOSE
LINK_REMOTE_DETACH = lib.PN_LINK_REMOTE_DETACH
LINK_FLOW = lib.PN_LINK_FLOW
DELIVERY = lib.PN_DELIVERY
TRANSPORT_ERROR = lib.PN_TRANSPORT_ERROR
TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED

# --------------------------------------------------------------------------- outcomes

ACCEPTED = lib.PN_ACCEPTED
REJECTED = lib.PN_REJECTED
RELEASED = lib.PN_RELEASED
MODIFIED = lib.PN_MODIFIED
RECEIVED = lib.PN_RECEIVED

# --------------------------------------------------------------------------- terminus values

TERMINUS_COORDINATOR = lib.PN_COORDINATOR
DIST_MODE_COPY = lib.PN_DIST_MODE_COPY
EXPIRE_NEVER = lib.PN_EXPIRE_NEVER
SND_SETTLED = lib.PN_SND_SETTLED
LOCAL_CLOSED = lib.PN_LOCAL_CLOSED
REMOTE_CLOSED = lib.PN_REMOTE_CLOSED

# ------------------------------------------------------------ hot path (bare C calls)

collector_peek = lib.pn_collector_peek
collector_pop = lib.pn_collector_pop
event_type = lib.pn_event_type
event_link = lib.pn_event_link
event_delivery = lib.pn_event_delivery
event_session = lib.pn_event_session
link_credit = lib.pn_link_credit
link_flow = lib.pn_link_flow
link_advance = lib.pn_link_advance
link_is_sender = lib.pn_link_is_sender
link_get_drain = lib.pn_link_get_drain
link_drained = lib.pn_link_drained
#: Receiver side: grant credit in drain mode / whether the sender has not drained yet.
link_drain = lib.pn_link_drain
link_draining = lib.pn_link_draining
link_snd_settle_mode = lib.pn_link_snd_settle_mode
link_state = lib.pn_link_state
delivery_link = lib.pn_delivery_link
delivery_readable = lib.pn_delivery_readable
delivery_partial = lib.pn_delivery_partial
delivery_aborted = lib.pn_delivery_aborted
delivery_pending = lib.pn_delivery_pending
delivery_updated = lib.pn_delivery_updated
delivery_remote_state = lib.pn_delivery_remote_state
delivery_settled = lib.pn_delivery_settled
delivery_update = lib.pn_delivery_update
delivery_settle = lib.pn_delivery_settle
transport_pending = lib.pn_transport_pending
transport_capacity = lib.pn_transport_capacity
transport_tick = lib.pn_transport_tick
#: Start a delivery with a tag by value (`new_tag`: proton copies it), add its bytes.
new_delivery = lib.pn_delivery
link_send = lib.pn_link_send

# Per message: module globals, as `lib.name` and `ffi.name` are lookups of their own (80 ns)
link_recv = lib.pn_link_recv
_unpack = ffi.unpack

_RECV_SIZE = 1 << 16
_OUT_SIZE = 1 << 18
_CHUNK_SIZE = 1 << 20  # `Engine.receive_chunks`: a large message's bytes, written as they come


class Buffers:
    """The C buffers the engines of one thread reuse, each copied out before its next use.

    One set per thread, not per process: proton's calls let the GIL go, so two brokers in
    one process (each on its own loop thread, as `BrokerThread` runs them) that shared a
    buffer handed each other's bytes to their clients. Not one per connection either: a
    set is 1.3 MiB.
    """

    __slots__ = ("chunk", "out", "recv")

    def __init__(self) -> None:
        self.recv = ffi.new("char[]", _RECV_SIZE)
        self.out = ffi.new("char[]", _OUT_SIZE)
        self.chunk = ffi.new("char[]", _CHUNK_SIZE)


_thread = threading.local()


def thread_buffers() -> Buffers:
    """This thread's buffers, made at its first call."""
    buffers: Buffers | None = getattr(_thread, "buffers", None)
    if buffers is None:
        buffers = _thread.buffers = Buffers()
    return buffers


def begin_send(link: CData, tag: bytes, data: bytes) -> CData:
    """Start a delivery on `link` with the first part of its message; the rest follows
    with `send_more`, and `link_advance` ends it."""
    delivery = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
    lib.pn_link_send(link, ffi.from_buffer(data), len(data))
    return delivery


def send_more(link: CData, data: bytes) -> None:
    """More of the message of the delivery `begin_send` started."""
    lib.pn_link_send(link, ffi.from_buffer(data), len(data))


#: Bytes a session holds that the peer's window has not let out yet.
session_outgoing_bytes = lib.pn_session_outgoing_bytes
#: Bytes a session holds that have arrived and not been read from their links yet.
session_incoming_bytes = lib.pn_session_incoming_bytes
#: Abort a delivery whose message cannot be sent in full.
delivery_abort = lib.pn_delivery_abort


def send(link: CData, tag: bytes, data: bytes) -> CData:
    """Start a delivery on `link` carrying `data` in full; returns the delivery.

    (A consumer link makes the three calls itself, with a tag made by `new_tag`.)"""
    delivery = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
    lib.pn_link_send(link, data, len(data))
    lib.pn_link_advance(link)
    return delivery


def disposition_failed(delivery: CData) -> tuple[bool, bool]:
    """(delivery-failed, undeliverable-here) of a remote `modified` outcome."""
    remote = lib.pn_delivery_remote(delivery)
    return bool(lib.pn_disposition_is_failed(remote)), bool(
        lib.pn_disposition_is_undeliverable(remote)
    )


def rejection(delivery: CData) -> tuple[str | None, str | None]:
    """The error condition of a remote `rejected` outcome."""
    return condition_of(lib.pn_disposition_condition(lib.pn_delivery_remote(delivery)))


def set_modified(delivery: CData, *, failed: bool, undeliverable: bool = False) -> None:
    local = lib.pn_delivery_local(delivery)
    lib.pn_disposition_set_failed(local, failed)
    lib.pn_disposition_set_undeliverable(local, undeliverable)


def reject(delivery: CData, condition: str, description: str) -> None:
    """Settle an incoming delivery as rejected with an error condition."""
    cond = lib.pn_disposition_condition(lib.pn_delivery_local(delivery))
    _set_condition(cond, condition, description)
    lib.pn_delivery_update(delivery, REJECTED)
    lib.pn_delivery_settle(delivery)


# --------------------------------------------------------------------------- connection setup


class Engine:
    """A proton transport bound to a connection, with its event collector.

    Server side by default; `server=False` makes a client end (for load generators and
    tests), which speaks plain AMQP without a SASL layer.
    """

    __slots__ = ("buffers", "collector", "connection", "transport")

    def __init__(
        self, *, max_frame: int, idle_timeout_ms: int, channel_max: int = 0, server: bool = True
    ) -> None:
        self.buffers = thread_buffers()
        self.transport = lib.pn_transport()
        if server:
            lib.pn_transport_set_server(self.transport)
        lib.pn_transport_set_max_frame(self.transport, max_frame)
        if idle_timeout_ms:
            lib.pn_transport_set_idle_timeout(self.transport, idle_timeout_ms)
        if channel_max:
            lib.pn_transport_set_channel_max(self.transport, channel_max)
        self.connection = lib.pn_connection()
        self.collector = lib.pn_collector()
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_transport_bind(self.transport, self.connection)

    def push(self, data: bytes | memoryview) -> bool:
        """Feed received bytes; False once the transport accepts no more input."""
        view = memoryview(data)
        while view:
            capacity = lib.pn_transport_capacity(self.transport)
            if capacity < 0:
                return False
            if capacity == 0:  # proton drains its input as it processes; should not happen
                return True
            chunk = view[:capacity]
            pushed = lib.pn_transport_push(self.transport, ffi.from_buffer(chunk), len(chunk))
            if pushed < 0:
                return False
            view = view[pushed:]
        if lib.pn_transport_capacity(self.transport) < 0:
            # proton stops reading a frame it cannot decode without saying why: say it, so
            # the peer gets a close with decode-error rather than silence (a peer's close
            # also ends the input: that one is no error)
            cond = lib.pn_transport_condition(self.transport)
            remote_closed = lib.pn_connection_state(self.connection) & lib.PN_REMOTE_CLOSED
            if not lib.pn_condition_is_set(cond) and not remote_closed:
                _set_condition(cond, "amqp:decode-error", "malformed frame: cannot decode it")
            lib.pn_transport_close_tail(self.transport)
            return False
        return True

    def output(self) -> bytes | None:
        """Bytes to write, b"" when none, None once the output side is closed for good."""
        pending = lib.pn_transport_pending(self.transport)
        if pending < 0:
            return None
        if pending == 0:
            return b""
        buf = self.buffers.out if pending <= _OUT_SIZE else ffi.new("char[]", pending)
        got = lib.pn_transport_peek(self.transport, buf, pending)
        if got < 0:
            return None
        lib.pn_transport_pop(self.transport, got)
        return ffi.unpack(buf, got)  # `receive`: cheaper than a buffer's slice

    def receive(self, link: CData, delivery: CData, size: int = -1) -> bytes:
        """The complete message of a readable, non-partial delivery; advances the link.

        `size` is its pending byte count when the caller already asked proton for it.
        """
        if size < 0:
            size = delivery_pending(delivery)
        buf = self.buffers.recv if size <= _RECV_SIZE else ffi.new("char[]", size)
        got = link_recv(link, buf, size)
        link_advance(link)
        # unpack copies the bytes out in one call: a third cheaper than a buffer's slice
        return _unpack(buf, got) if got > 0 else b""

    def receive_chunks(self, link: CData, size: int) -> Iterator[memoryview]:
        """The `size` bytes a delivery has pending, in pieces, without advancing the link
        (a large message, written out as it arrives). Each piece is a view of a reused
        buffer: valid until the next one is asked for."""
        chunk = self.buffers.chunk
        view = memoryview(ffi.buffer(chunk))
        while size > 0:
            got = lib.pn_link_recv(link, chunk, min(size, _CHUNK_SIZE))
            if got <= 0:
                return
            size -= got
            yield view[:got]

    def close_input(self) -> None:
        lib.pn_transport_close_tail(self.transport)

    def close_output(self) -> None:
        lib.pn_transport_close_head(self.transport)

    def tick(self, now_ms: int) -> int:
        """Run idle-timeout bookkeeping; returns the next deadline in ms (0: none)."""
        return int(lib.pn_transport_tick(self.transport, now_ms))

    def remote_idle_timeout(self) -> int:
        """The peer's idle-timeout in ms (0: none): it wants a frame at least every half."""
        return int(lib.pn_transport_get_remote_idle_timeout(self.transport))

    def remote_max_frame(self) -> int:
        """The largest frame the peer takes (0: no limit asked)."""
        return int(lib.pn_transport_get_remote_max_frame(self.transport))

    def transport_condition(self) -> tuple[str | None, str | None]:
        return condition_of(lib.pn_transport_condition(self.transport))

    def free(self) -> None:
        lib.pn_connection_collect(self.connection, ffi.NULL)
        lib.pn_transport_unbind(self.transport)
        lib.pn_decref(self.transport)
        lib.pn_connection_release(self.connection)
        lib.pn_decref(self.connection)  # pn_connection() handed us a reference
        lib.pn_collector_free(self.collector)


def open_connection(connection: CData, container_id: str, properties: Mapping[str, Any]) -> None:
    lib.pn_connection_set_container(connection, container_id.encode())
    _put_symbol_map(lib.pn_connection_properties(connection), properties)
    lib.pn_connection_open(connection)


def close_connection(
    connection: CData, condition: str | None = None, description: str = ""
) -> None:
    if condition:
        _set_condition(lib.pn_connection_condition(connection), condition, description)
    lib.pn_connection_close(connection)


def remote_container(connection: CData) -> str:
    return _string(lib.pn_connection_remote_container(connection))


def remote_connection_condition(connection: CData) -> tuple[str | None, str | None]:
    return condition_of(lib.pn_connection_remote_condition(connection))


def open_session(session: CData) -> None:
    lib.pn_session_open(session)


def close_session(session: CData) -> None:
    lib.pn_session_close(session)


def refuse_session(session: CData, condition: str, description: str) -> None:
    """Begin then end a session the peer asked for, with an error saying why."""
    _set_condition(lib.pn_session_condition(session), condition, description)
    lib.pn_session_open(session)
    lib.pn_session_close(session)


def connection_state(connection: CData) -> int:
    return int(lib.pn_connection_state(connection))


def free_session(session: CData) -> None:
    lib.pn_session_free(session)


# --------------------------------------------------------------------------- links


class TerminusInfo:
    """What the peer asked for in a link's source or target."""

    __slots__ = (
        "address",
        "capabilities",
        "distribution_mode",
        "durable",
        "dynamic",
        "expiry_never",
        "filters",
        "is_coordinator",
        "properties",
    )

    def __init__(self, terminus: CData) -> None:
        self.address = _string(lib.pn_terminus_get_address(terminus)) or None
        self.dynamic = bool(lib.pn_terminus_is_dynamic(terminus))
        self.durable = lib.pn_terminus_get_durability(terminus) != lib.PN_NONDURABLE
        self.expiry_never = lib.pn_terminus_get_expiry_policy(terminus) == EXPIRE_NEVER
        self.distribution_mode = int(lib.pn_terminus_get_distribution_mode(terminus))
        self.is_coordinator = lib.pn_terminus_get_type(terminus) == TERMINUS_COORDINATOR
        caps = decode_data(lib.pn_terminus_capabilities(terminus))
        if caps is None:
            self.capabilities: frozenset[str] = frozenset()
        elif isinstance(caps, (list, tuple)):
            self.capabilities = frozenset(str(c) for c in caps)
        else:
            self.capabilities = frozenset({str(caps)})
        filters = decode_data(lib.pn_terminus_filter(terminus))
        self.filters: dict[str, Any] = filters if isinstance(filters, dict) else {}
        properties = decode_data(lib.pn_terminus_properties(terminus))
        #: dynamic-node-properties: how to create the node, if the peer asks for that.
        self.properties: dict[str, Any] = properties if isinstance(properties, dict) else {}


def link_name(link: CData) -> str:
    return _string(lib.pn_link_name(link))


def remote_source(link: CData) -> TerminusInfo:
    return TerminusInfo(lib.pn_link_remote_source(link))


def remote_target(link: CData) -> TerminusInfo:
    return TerminusInfo(lib.pn_link_remote_target(link))


def link_session(link: CData) -> CData:
    return lib.pn_link_session(link)


#: An attach's bytes besides its names and terminus values, counted high: the frame
#: header, the performative's descriptor and list, its fixed fields and the termini's.
_ATTACH_FIXED = 128


def answer_size(link: CData) -> int:
    """At most about how many bytes the attach answering `link` takes: it echoes the
    peer's source and target (`open_link`), filters and capabilities included."""
    size = _ATTACH_FIXED + _bytes_at(lib.pn_link_name(link))
    for terminus in (lib.pn_link_remote_source(link), lib.pn_link_remote_target(link)):
        size += _bytes_at(lib.pn_terminus_get_address(terminus))
        for data in (
            lib.pn_terminus_properties(terminus),
            lib.pn_terminus_capabilities(terminus),
            lib.pn_terminus_outcomes(terminus),
            lib.pn_terminus_filter(terminus),
        ):
            lib.pn_data_rewind(data)
            size += max(int(lib.pn_data_encoded_size(data)), 0)
    return size


def _bytes_at(text: CData) -> int:
    return len(ffi.string(text)) if text else 0


def open_link(
    link: CData,
    *,
    address: str | None,
    dynamic: bool = False,
    capabilities: Iterable[str] = (),
) -> None:
    """Open our end mirroring the peer's terminus, with the address we resolved."""
    if lib.pn_link_is_sender(link):
        local, remote = lib.pn_link_source(link), lib.pn_link_remote_source(link)
        lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))
    else:
        local, remote = lib.pn_link_target(link), lib.pn_link_remote_target(link)
        lib.pn_terminus_copy(lib.pn_link_source(link), lib.pn_link_remote_source(link))
    lib.pn_terminus_copy(local, remote)
    if address is not None:
        lib.pn_terminus_set_address(local, address.encode())
    if dynamic:
        lib.pn_terminus_set_dynamic(local, False)
    caps = list(capabilities)
    if caps:
        _put_symbol_array(lib.pn_terminus_capabilities(local), caps)
    lib.pn_link_open(link)


def set_max_message_size(link: CData, size: int) -> None:
    """Tell the peer the largest message this link takes (0: no limit)."""
    lib.pn_link_set_max_message_size(link, size)


def refuse_link(link: CData, condition: str, description: str) -> None:
    """Attach with a null terminus then close with an error, as the spec asks."""
    if lib.pn_link_is_sender(link):
        lib.pn_terminus_set_type(lib.pn_link_source(link), lib.PN_UNSPECIFIED)
    else:
        lib.pn_terminus_set_type(lib.pn_link_target(link), lib.PN_UNSPECIFIED)
    lib.pn_link_open(link)
    close_link(link, condition, description)


def close_link(link: CData, condition: str | None = None, description: str = "") -> None:
    if condition:
        _set_condition(lib.pn_link_condition(link), condition, description)
    lib.pn_link_close(link)


def detach_link(link: CData) -> None:
    lib.pn_link_detach(link)


def remote_closed(link: CData) -> bool:
    """True when the peer closed (rather than detached) the link."""
    return bool(lib.pn_link_state(link) & REMOTE_CLOSED)


def free_link(link: CData) -> None:
    lib.pn_link_free(link)


def set_sender_settle_mode_settled(link: CData) -> None:
    lib.pn_link_set_snd_settle_mode(link, SND_SETTLED)


def set_source_filter(link: CData, encoded: bytes) -> None:
    """Set a receiver's source filter map from its AMQP encoding (before it attaches)."""
    data = lib.pn_terminus_filter(lib.pn_link_source(link))
    lib.pn_data_clear(data)
    if lib.pn_data_decode(data, ffi.from_buffer(encoded), len(encoded)) < 0:
        raise ValueError("source filter: not one AMQP encoded value")


# --------------------------------------------------------------------------- data helpers


def decode_data(data: CData) -> Any:
    """A pn_data_t's first value as Python, via its AMQP encoding and our codec."""
    lib.pn_data_rewind(data)
    if not lib.pn_data_next(data):
        return None
    size = lib.pn_data_encoded_size(data)
    if size <= 0:
        return None
    buf = ffi.new("char[]", size)
    lib.pn_data_rewind(data)
    written = lib.pn_data_encode(data, buf, size)
    if written < 0:
        return None
    value, _ = codec.decode_value(ffi.buffer(buf, written)[:], 0)
    return value


def condition_of(cond: CData) -> tuple[str | None, str | None]:
    if not lib.pn_condition_is_set(cond):
        return None, None
    return _string(lib.pn_condition_get_name(cond)) or None, _string(
        lib.pn_condition_get_description(cond)
    )


def _set_condition(cond: CData, name: str, description: str) -> None:
    lib.pn_condition_set_name(cond, name.encode())
    lib.pn_condition_set_description(cond, description.encode())


def _string(ptr: CData) -> str:
    return ffi.string(ptr).decode("utf-8", "replace") if ptr else ""


def _bytes(value: str) -> tuple[int, CData]:
    raw = value.encode()
    return len(raw), ffi.from_buffer(raw)


def _put_symbol_map(data: CData, values: Mapping[str, Any]) -> None:
    """A map with symbol keys; values are strings, ints, or lists and maps of them."""
    lib.pn_data_clear(data)
    _put_map(data, values)


def _put_map(data: CData, values: Mapping[str, Any]) -> None:
    lib.pn_data_put_map(data)
    lib.pn_data_enter(data)
    for key, value in values.items():
        key_raw = key.encode()
        lib.pn_data_put_symbol(data, (len(key_raw), ffi.from_buffer(key_raw)))
        _put_value(data, value)
    lib.pn_data_exit(data)


def _put_value(data: CData, value: Any) -> None:
    if isinstance(value, str):
        raw = value.encode()
        lib.pn_data_put_string(data, (len(raw), ffi.from_buffer(raw)))
    elif isinstance(value, bool):
        lib.pn_data_put_bool(data, value)
    elif isinstance(value, int):
        lib.pn_data_put_int(data, value)
    elif isinstance(value, Mapping):
        _put_map(data, value)
    else:
        lib.pn_data_put_list(data)
        lib.pn_data_enter(data)
        for item in value:
            _put_value(data, item)
        lib.pn_data_exit(data)


def _put_symbol_array(data: CData, values: list[str]) -> None:
    lib.pn_data_clear(data)
    lib.pn_data_put_array(data, False, lib.PN_SYMBOL)
    lib.pn_data_enter(data)
    for value in values:
        raw = value.encode()
        lib.pn_data_put_symbol(data, (len(raw), ffi.from_buffer(raw)))
    lib.pn_data_exit(data)


# --------------------------------------------------------------------------- client side


def client_open(connection: CData, container_id: str, hostname: str = "") -> None:
    lib.pn_connection_set_container(connection, container_id.encode())
    if hostname:
        lib.pn_connection_set_hostname(connection, hostname.encode())
    lib.pn_connection_open(connection)


def new_session(connection: CData) -> CData:
    session = lib.pn_session(connection)
    lib.pn_session_open(session)
    return session


def new_sender(session: CData, name: str, address: str, *, presettled: bool = False) -> CData:
    link = lib.pn_sender(session, name.encode())
    lib.pn_terminus_set_address(lib.pn_link_target(link), address.encode())
    lib.pn_terminus_set_address(lib.pn_link_source(link), name.encode())
    if presettled:
        lib.pn_link_set_snd_settle_mode(link, SND_SETTLED)
    lib.pn_link_open(link)
    return link


def new_receiver(session: CData, name: str, address: str, credit: int) -> CData:
    link = lib.pn_receiver(session, name.encode())
    lib.pn_terminus_set_address(lib.pn_link_source(link), address.encode())
    lib.pn_terminus_set_address(lib.pn_link_target(link), name.encode())
    lib.pn_link_open(link)
    if credit:
        lib.pn_link_flow(link, credit)
    return link


# --------------------------------------------------------------------------- delivery states


def remote_state_fields(delivery: CData) -> list[Any]:
    """The fields of a remote delivery state proton does not model (transactional-state)."""
    value = decode_data(lib.pn_disposition_data(lib.pn_delivery_remote(delivery)))
    return list(value) if isinstance(value, (list, tuple)) else []


def update_with_fields(delivery: CData, state: int, fields: list[Any]) -> None:
    """Set our delivery state to a described state `state` carrying `fields` (a list)."""
    data = lib.pn_disposition_data(lib.pn_delivery_local(delivery))
    lib.pn_data_clear(data)
    encoded = codec.encode_value(list(fields))
    lib.pn_data_decode(data, encoded, len(encoded))
    lib.pn_delivery_update(delivery, state)


# ---- perf additions
# For `scow perf`: socket I/O through preallocated C buffers, tags and messages patched in
# place, and endpoint states polled instead of events collected, so that a load generator
# pays for as few calls and copies per message as the engine allows.

link_current = lib.pn_link_current
link_head = lib.pn_link_head
link_next = lib.pn_link_next
link_remote_snd_settle_mode = lib.pn_link_remote_snd_settle_mode
session_head = lib.pn_session_head
session_next = lib.pn_session_next
transport_push = lib.pn_transport_push
transport_peek = lib.pn_transport_peek
transport_pop = lib.pn_transport_pop
LOCAL_UNINIT = lib.PN_LOCAL_UNINIT
LOCAL_ACTIVE = lib.PN_LOCAL_ACTIVE
REMOTE_ACTIVE = lib.PN_REMOTE_ACTIVE


def new_buffer(size: int) -> tuple[CData, memoryview]:
    """A C byte buffer and a writable view of the same memory."""
    buf = ffi.new("char[]", size)
    return buf, memoryview(ffi.buffer(buf))


def new_tag(size: int = 8) -> tuple[CData, memoryview]:
    """A delivery tag to pass to `new_delivery` (by value) and a view to rewrite it through."""
    buf, view = new_buffer(size)
    tag = ffi.new("pn_delivery_tag_t *", (size, buf))
    # the struct points into `buf` without owning it; the view keeps `buf` alive
    return tag[0], view


def stop_events(eng: Engine) -> None:
    """Stop recording events: the caller polls endpoint states and links instead.

    Saves the create-peek-pop round of one event per transfer and per disposition.
    """
    lib.pn_connection_collect(eng.connection, ffi.NULL)


def remote_link_condition(link: CData) -> tuple[str | None, str | None]:
    return condition_of(lib.pn_link_remote_condition(link))
