"""Routing keys: which segment of a stream an event with a given key goes to.

Pravega routes on the client side. A stream's open segments partition the key
space [0, 1) into ranges (``SegmentRange.minKey``/``maxKey`` from the
controller's ``getCurrentSegments``); a writer hashes the event's routing key to
a point in that space and appends to the segment whose range holds it. Every
client must use the same function, or events with one key written by two
clients would land in two segments and lose their per-key order. The function
(``docs/protocols/pravega-controller.md#routing-keys``):

1. take the key's **UTF-16 code units** (Java ``String`` chars), each written
   as two bytes, **little-endian** (Guava's ``hashUnencodedChars``);
2. hash them with **MurmurHash3 x64 128-bit**, seed ``1741865571``
   (``"EventRouter".hashCode()`` in Java) used for both 64-bit lanes;
3. keep ``h1``, the first 64-bit word the algorithm outputs (Guava's
   ``HashCode.asLong()``, the Rust client's "upper" half; in the common
   "128-bit integer from the 16 little-endian output bytes" reading, as
   the ``mmh3`` package returns it, these are the *low* 64 bits);
4. scale it to [0, 1) by keeping its top 52 bits as the mantissa of a double in
   [1, 2) and subtracting 1: ``((h1 >> 12) | 0x3FF0 << 48) as double - 1``.

A point maps to the segment with the smallest upper bound ``>= point`` (Java's
``TreeMap.ceilingEntry``, the Rust client's ``OrdMap::get_next`` over the ranges
keyed by ``maxKey``); a point exactly on a boundary therefore belongs to the
lower range, matching both clients.

Non-ASCII keys: the Rust client (``pravega`` on PyPI, 0.3.x) sizes its UTF-16
buffer by the key's UTF-8 *byte* length and hashes the whole buffer, so a key
with non-ASCII characters is hashed with trailing zero code units the Java
client does not hash. The two reference clients therefore disagree on such
keys. :func:`routing_key_position` follows Java;
``routing_key_position(key, rust_client_compat=True)`` reproduces the Rust
client byte for byte. For ASCII keys the two agree.

This module is pure computation (no I/O); the hash uses the ``mmh3`` C
extension when it is installed and a pure-Python MurmurHash3 otherwise (same
results, checked by the tests; the C version is much faster).
"""

from __future__ import annotations

import bisect
import importlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Generic, TypeVar

__all__ = [
    "ROUTING_KEY_SEED",
    "TABLE_KEY_SEED",
    "KeyRanges",
    "murmur3_x64_128",
    "position_to_fraction",
    "routing_key_bytes",
    "routing_key_position",
    "segment_for_key",
    "table_key_position",
]

ROUTING_KEY_SEED = 1741865571
"""Murmur3 seed of Pravega's event router: the Java ``hashCode()`` of ``"EventRouter"``."""

TABLE_KEY_SEED = -2020233499
"""Murmur3 seed of the Java client's key-value table router: the Java ``hashCode()``
of ``"KeyValueTableRouter"``. Negative: Guava sign-extends it into both lanes."""

_MASK64 = (1 << 64) - 1
_C1 = 0x87C37B91114253D5  # MurmurHash3 x64_128 mixing constants (smhasher)
_C2 = 0x4CF5AD432745937F
_DOUBLE_ONE_BITS = 0x3FF0_0000_0000_0000  # IEEE 754 bits of 1.0: exponent 0, mantissa 0
_MANTISSA_MASK = 0x000F_FFFF_FFFF_FFFF  # the 52 mantissa bits of a double
_BLOCK = struct.Struct("<QQ")  # one 16-byte murmur block: two little-endian words
_DOUBLE = struct.Struct("<d")
_U64 = struct.Struct("<Q")

T = TypeVar("T")


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK64


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _MASK64
    k ^= k >> 33
    return k


def _murmur3_x64_128_py(data: bytes, seed: int) -> tuple[int, int]:
    """Reference MurmurHash3_x64_128 (smhasher), in Python; returns ``(h1, h2)``."""
    length = len(data)
    h1 = h2 = seed & _MASK64
    nblocks = length // 16
    for k1, k2 in _BLOCK.iter_unpack(data[: nblocks * 16]):
        k1 = (k1 * _C1) & _MASK64
        k1 = _rotl64(k1, 31)
        k1 = (k1 * _C2) & _MASK64
        h1 ^= k1
        h1 = _rotl64(h1, 27)
        h1 = (h1 + h2) & _MASK64
        h1 = (h1 * 5 + 0x52DCE729) & _MASK64
        k2 = (k2 * _C2) & _MASK64
        k2 = _rotl64(k2, 33)
        k2 = (k2 * _C1) & _MASK64
        h2 ^= k2
        h2 = _rotl64(h2, 31)
        h2 = (h2 + h1) & _MASK64
        h2 = (h2 * 5 + 0x38495AB5) & _MASK64
    tail = data[nblocks * 16 :]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        k2 = (k2 * _C2) & _MASK64
        k2 = _rotl64(k2, 33)
        k2 = (k2 * _C1) & _MASK64
        h2 ^= k2
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        k1 = (k1 * _C1) & _MASK64
        k1 = _rotl64(k1, 31)
        k1 = (k1 * _C2) & _MASK64
        h1 ^= k1
    h1 ^= length
    h2 ^= length
    h1 = (h1 + h2) & _MASK64
    h2 = (h2 + h1) & _MASK64
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 = (h1 + h2) & _MASK64
    h2 = (h2 + h1) & _MASK64
    return h1, h2


def _load_mmh3() -> ModuleType | None:
    # Imported by name so that type checking passes whether or not the optional
    # C extension is installed.
    try:
        return importlib.import_module("mmh3")
    except ImportError:  # pragma: no cover - depends on the environment
        return None


_mmh3 = _load_mmh3()


def murmur3_x64_128(data: bytes, seed: int = ROUTING_KEY_SEED) -> tuple[int, int]:
    """MurmurHash3 x64 128-bit of ``data``, as the two unsigned 64-bit words ``(h1, h2)``.

    Args:
        data: the bytes to hash.
        seed: a 32-bit seed, used for both lanes; a negative one (a Java
            ``int``) is sign-extended to 64 bits, as Guava does.

    Returns:
        ``(h1, h2)`` in the order the algorithm outputs them (h1 is Guava's
        ``asLong()``).
    """
    if _mmh3 is not None and 0 <= seed < 2**32:
        h1, h2 = _mmh3.hash64(data, seed, signed=False)
        return int(h1), int(h2)
    return _murmur3_x64_128_py(data, seed)


def position_to_fraction(h1: int) -> float:
    """Scale a 64-bit hash word to [0, 1) as Pravega's ``longToDoubleFraction`` does.

    The top 52 bits become the mantissa of a double in [1, 2); 1 is subtracted.
    """
    bits = _DOUBLE_ONE_BITS + ((h1 >> 12) & _MANTISSA_MASK)
    return float(_DOUBLE.unpack(_U64.pack(bits))[0]) - 1.0


def routing_key_bytes(key: str, *, rust_client_compat: bool = False) -> bytes:
    """The bytes the routing hash covers: the key's UTF-16LE code units.

    Lone surrogates are allowed (a Java ``String`` may hold them). With
    ``rust_client_compat`` the buffer is zero-padded to twice the key's UTF-8
    length, as the Rust client does (see the module docstring).
    """
    units = key.encode("utf-16-le", "surrogatepass")
    if rust_client_compat:
        size = 2 * len(key.encode("utf-8", "surrogatepass"))
        units = units.ljust(size, b"\x00")
    return units


def routing_key_position(key: str, *, rust_client_compat: bool = False) -> float:
    """Where a routing key falls in a stream's key space [0, 1).

    Args:
        key: the routing key.
        rust_client_compat: hash non-ASCII keys as the Rust client does instead
            of as the Java client does (identical for ASCII keys).

    Returns:
        A float ``0 <= p < 1``; the event goes to the segment whose key range
        has the smallest upper bound ``>= p``.
    """
    h1, _h2 = murmur3_x64_128(routing_key_bytes(key, rust_client_compat=rust_client_compat))
    return position_to_fraction(h1)


def table_key_position(primary_key: bytes) -> float:
    """Where a key-value table key falls in the table's key space [0, 1).

    The Java client (``KeyValueTableSegments``) hashes the key's primary-key
    bytes as they are (no UTF-16 step) with seed ``TABLE_KEY_SEED`` and scales
    the first word as for routing keys; the partition is then chosen by the
    same ``maxKey`` rule (``KeyRanges.segment_for_position``).
    """
    h1, _h2 = murmur3_x64_128(primary_key, TABLE_KEY_SEED)
    return position_to_fraction(h1)


@dataclass(frozen=True, slots=True)
class KeyRanges(Generic[T]):
    """The open segments of a stream, as ranges of the key space, for routing.

    Build it with :meth:`from_ranges`; ``segment_for_key`` and
    ``segment_for_position`` then choose a segment in O(log n).

    Attributes:
        upper_bounds: each range's upper bound (``maxKey``), ascending.
        segments: the segment owning each range, parallel to ``upper_bounds``.
    """

    upper_bounds: tuple[float, ...]
    segments: tuple[T, ...]

    @classmethod
    def from_ranges(cls, ranges: Iterable[tuple[T, float, float]]) -> KeyRanges[T]:
        """Build from ``(segment, min_key, max_key)`` triples, in any order.

        Raises:
            ValueError: the ranges do not partition [0, 1) (a gap, an overlap,
                or not starting at 0 / ending at 1).
        """
        ordered = sorted(ranges, key=lambda r: r[2])
        if not ordered:
            raise ValueError("a stream has at least one open segment")
        expected_low = 0.0
        for _segment, low, high in ordered:
            if low != expected_low or not low < high:
                raise ValueError(f"key ranges do not partition [0, 1): {ordered!r}")
            expected_low = high
        if expected_low != 1.0:
            raise ValueError(f"key ranges do not reach 1.0: {ordered!r}")
        return cls(tuple(r[2] for r in ordered), tuple(r[0] for r in ordered))

    def segment_for_position(self, position: float) -> T:
        """The segment whose range holds ``position`` (0 <= position <= 1)."""
        if not 0.0 <= position <= 1.0:
            raise ValueError(f"key position {position!r} is outside [0, 1]")
        return self.segments[bisect.bisect_left(self.upper_bounds, position)]

    def segment_for_key(self, key: str, *, rust_client_compat: bool = False) -> T:
        """The segment an event with routing key ``key`` goes to."""
        return self.segment_for_position(
            routing_key_position(key, rust_client_compat=rust_client_compat)
        )


def segment_for_key(
    ranges: Sequence[tuple[T, float, float]], key: str, *, rust_client_compat: bool = False
) -> T:
    """One-shot helper: the segment of ``ranges`` (``(segment, min, max)``) for ``key``."""
    return KeyRanges.from_ranges(ranges).segment_for_key(key, rust_client_compat=rust_client_compat)
