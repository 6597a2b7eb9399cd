"""Hostile AMQP for the fuzz suite: frames of valid structure with bad values.

Values are built as encoded bytes directly, so they can lie where no encoder would: a
str32 or list32 whose declared size is near 4 GiB, counts larger than the bytes that
follow, lists nested hundreds deep, descriptors nobody defined, constructors that do not
exist, and fields of the wrong type in every performative. A case is what one peer sends
after the protocol header: an open, sessions on several channels, links, then hostile
frames interleaved between those channels.

Hypothesis draws a seed per batch (`batches`) and the builders below spend a Random
seeded with it: drawing each choice through Hypothesis costs ~15 ms a case, this ~30 us,
which is what lets 10 k cases run in the default suite.
"""

from __future__ import annotations

import random
import struct

from hypothesis import strategies as st

from scow.protocols.amqp.codec import Described, UInt, encode_value
from tests.security import frames

_FRAME = struct.Struct(">IBBH")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz:.-"

# --------------------------------------------------------------------------- values


def _sized(code8: int, code32: int, payload: bytes) -> bytes:
    if len(payload) < 256:
        return bytes([code8, len(payload)]) + payload
    return bytes([code32]) + struct.pack(">I", len(payload)) + payload


def _compound(code8: int, code32: int, items: list[bytes]) -> bytes:
    body = b"".join(items)
    if len(body) < 255 and len(items) < 256:
        return bytes([code8, len(body) + 1, len(items)]) + body
    return bytes([code32]) + struct.pack(">II", len(body) + 4, len(items)) + body


def _text(rng: random.Random, alphabet: str = _ALPHABET, size: int = 30) -> bytes:
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(size))).encode()


def primitive(rng: random.Random) -> bytes:
    kind = rng.randrange(10)
    if kind == 0:
        return b"\x40"  # null
    if kind == 1:
        return rng.choice([b"\x41", b"\x42", b"\x56\x00", b"\x56\x01", b"\x56\x07"])
    if kind == 2:
        return b"\x50" + bytes([rng.randrange(256)])  # ubyte
    if kind == 3:
        return b"\x70" + struct.pack(">I", rng.getrandbits(32))  # uint
    if kind == 4:
        return b"\x80" + struct.pack(">Q", rng.getrandbits(64))  # ulong
    if kind == 5:
        return b"\x71" + struct.pack(">i", rng.getrandbits(32) - 2**31)  # int
    if kind == 6:
        return _sized(0xA1, 0xB1, _text(rng, "héllo wörld ☃", 40))  # string
    if kind == 7:
        return _sized(0xA3, 0xB3, _text(rng))  # symbol
    if kind == 8:
        return _sized(0xA0, 0xB0, rng.randbytes(rng.randrange(64)))  # binary
    return b"\xa1\x03\xff\xfe\xfd"  # a string that is not UTF-8


#: Encodings that lie: sizes and counts far beyond the bytes present.
LIES = (
    b"\xb1\xff\xff\xff\xf0abc",  # str32 claiming ~4 GiB
    b"\xb0\x7f\xff\xff\xffxyz",  # bin32 claiming 2 GiB
    b"\xd0\xff\xff\xff\xf0\xff\xff\xff\xff",  # list32 of 4 billion items
    b"\xd1\x00\x00\x00\x08\xff\xff\xff\xff",  # map32 with an odd, huge count
    b"\xf0\xff\xff\xff\xf0\x7f\xff\xff\xff\x70",  # array32 of 2 billion uints
    b"\xe0\x05\x03\x71\x00\x01",  # array8 with too few element bytes
    b"\xc0\x02\x05\x40",  # list8 whose count exceeds its size
    b"\x00\x00",  # a descriptor that is itself a bare descriptor marker
    b"\x00",  # a descriptor marker and nothing after
)

_KNOWN_CONSTRUCTORS = frozenset(
    b"\x00\x40\x41\x42\x43\x44\x45\x50\x51\x52\x53\x54\x55\x56\x60\x61\x70\x71\x72\x73"
    b"\x80\x81\x82\x83\x84\x94\x98\xa0\xa1\xa3\xb0\xb1\xb3\xc0\xc1\xd0\xd1\xe0\xf0"
)
_UNKNOWN_CONSTRUCTORS = [c for c in range(256) if c not in _KNOWN_CONSTRUCTORS]


def hostile(rng: random.Random) -> bytes:
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(LIES)
    if kind == 1:
        return bytes([rng.choice(_UNKNOWN_CONSTRUCTORS)]) + rng.randbytes(4)
    return rng.randbytes(rng.randrange(1, 24))  # noise


def deep(depth: int, inner: bytes = b"\x40") -> bytes:
    """Lists nested `depth` deep (each level a list8 or list32 of one item)."""
    value = inner
    for _ in range(depth):
        value = _compound(0xC0, 0xD0, [value])
    return value


def descriptor(rng: random.Random) -> bytes:
    kind = rng.randrange(3)
    if kind == 0:
        return b"\x80" + struct.pack(">Q", rng.getrandbits(64))  # any ulong
    if kind == 1:
        return b"\x53" + bytes(
            [
                rng.choice(
                    [
                        0x10,
                        0x11,
                        0x12,
                        0x13,
                        0x14,
                        0x15,
                        0x16,
                        0x17,
                        0x18,
                        0x1D,
                        0x23,
                        0x28,
                        0x29,
                        0x77,
                    ]
                )
            ]
        )
    return _sized(0xA3, 0xB3, _text(rng) or b"x")  # a symbolic descriptor


def value(rng: random.Random, depth: int = 0) -> bytes:
    """Any value: primitive, lying, or a compound of more values."""
    kind = rng.randrange(8 if depth < 3 else 2)
    if kind == 0:
        return primitive(rng)
    if kind == 1:
        return hostile(rng)
    if kind in (2, 3):
        return _compound(0xC0, 0xD0, [value(rng, depth + 1) for _ in range(rng.randrange(6))])
    if kind == 4:
        pairs = rng.randrange(3) * 2
        return _compound(0xC1, 0xD1, [value(rng, depth + 1) for _ in range(pairs)])
    if kind == 5:
        return b"\x00" + descriptor(rng) + value(rng, depth + 1)
    if kind == 6:
        return deep(rng.randrange(50, 600), value(rng, 3))
    return primitive(rng)


# --------------------------------------------------------------------------- frames


def raw_frame(body: bytes, channel: int, *, size_delta: int = 0, frame_type: int = 0) -> bytes:
    return _FRAME.pack(8 + len(body) + size_delta, 2, frame_type, channel) + body


def hostile_frame(rng: random.Random, channels: int) -> bytes:
    """One frame on one of the case's channels (or one it never began)."""
    channel = rng.randrange(channels) if rng.random() < 0.8 else rng.choice([7, 255, 65535])
    kind = rng.randrange(10)
    if kind == 0:  # a performative whose fields are anything at all
        fields = [value(rng) for _ in range(rng.randrange(12))]
        body = b"\x00" + descriptor(rng) + _compound(0xC0, 0xD0, fields)
    elif kind == 1:  # a performative that is not a described list
        body = b"\x00" + descriptor(rng) + value(rng)
    elif kind == 2:  # a transfer on a link of the case, carrying a hostile message
        body = encode_value(
            Described(
                0x14,
                [
                    UInt(rng.randrange(4)),
                    UInt(rng.getrandbits(32)),
                    b"t",
                    UInt(0),
                    rng.random() < 0.5,
                    rng.random() < 0.3,
                ],
            )
        )
        body += rng.choice([b"\x00\x53\x75", b"\x00\x53\x70", b"\x00\x53\x74", b""])
        body += value(rng) if rng.random() < 0.7 else rng.randbytes(rng.randrange(256))
    elif kind == 3:  # a flow with absurd credit or windows
        body = encode_value(
            Described(
                0x13,
                [UInt(rng.getrandbits(32)) for _ in range(4)]
                + [UInt(rng.randrange(4)), UInt(0), UInt(rng.getrandbits(32))],
            )
        )
    elif kind == 4:  # a disposition over a huge range of deliveries
        body = encode_value(
            Described(
                0x15, [rng.random() < 0.5, UInt(0), UInt(2**32 - 1), True, Described(0x24, [])]
            )
        )
    elif kind == 5:  # an empty frame (a heartbeat), allowed anywhere
        body = b""
    elif kind == 6:  # a frame whose declared size is wrong or enormous
        return raw_frame(value(rng), channel, size_delta=rng.choice([-3, 1, 2**31]))
    elif kind == 7:  # an attach with hostile termini and properties
        fields = [
            _sized(0xA1, 0xB1, b"fuzz-link"),
            b"\x70" + struct.pack(">I", rng.randrange(6)),
            rng.choice([b"\x41", b"\x42"]),
            b"\x40",
            b"\x40",
        ]
        fields += [value(rng) for _ in range(9)]
        body = b"\x00\x53\x12" + _compound(0xC0, 0xD0, fields)
    elif kind == 8:  # a begin on a channel in use, or an end / detach / close with junk
        code = rng.choice([0x11, 0x16, 0x17, 0x18])
        fields = [value(rng) for _ in range(rng.randrange(5))]
        body = b"\x00\x53" + bytes([code]) + _compound(0xC0, 0xD0, fields)
    else:  # a SASL frame where AMQP is expected
        return raw_frame(value(rng), channel, frame_type=1)
    return raw_frame(body, channel)


def case(rng: random.Random) -> bytes:
    """What one hostile peer sends after the AMQP header."""
    sessions = rng.randrange(1, 4)
    out = [frames.open_("fuzz")]
    for channel in range(sessions):
        out.append(frames.begin(channel))
        for handle in range(rng.randrange(3)):
            out.append(frames.attach_sender(channel, handle, f"fuzz.{handle}"))
    out += [hostile_frame(rng, sessions) for _ in range(rng.randrange(1, 7))]
    return b"".join(out)


def batches(size: int) -> st.SearchStrategy[list[bytes]]:
    """Batches of `size` cases, each batch from a Random seeded by Hypothesis (a failing
    batch is reported with its seed, and rebuilt from it)."""
    return st.integers(0, 2**64 - 1).map(lambda seed: _batch(random.Random(seed), size))


def _batch(rng: random.Random, size: int) -> list[bytes]:
    return [case(rng) for _ in range(size)]
