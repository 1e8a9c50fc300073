"""Serialization and signing of cached values.

A cached value is stored in Redis as one self-describing frame. Besides the serialized value it
carries δ, the seconds the fill took, which XFetch needs to decide how early to refresh (see
``_xfetch``). The frame is versioned so that a later release can change it without misreading
entries written by this one, and it can be signed, because ``pickle.loads`` of bytes that anyone
with write access to Redis can set is remote code execution.

Frame format, version 1 (all integers big-endian)::

    offset  size  field
    0       2     magic  b"RM"
    2       1     version  0x01
    3       1     flags    bit 0: signed; bits 1-2: serializer (1 pickle, 2 json, 3 custom);
                           bits 3-7: zero
    4       8     delta    IEEE-754 float64, finite and >= 0 (seconds the fill took)
    12      4     length   uint32, number of body bytes
    16      n     body     the serializer's output
    16+n    32    mac      only when signed: HMAC-SHA256(secret, u32(len(context)) || context
                           || bytes 0 .. 16+n)

A frame must be exactly ``16 + length (+ 32)`` bytes long. ``context`` (empty by default) lets a
caller bind a signed value to the key it was stored under, so that a valid payload copied to
another key fails the check too.

``Codec.decode`` raises ``PayloadError`` for anything that is not a frame this codec wrote: bad
magic, unknown version or flags, wrong length, a serializer other than the codec's, a signed
frame for an unsigned codec or the reverse, a failed signature check, or a body the serializer
cannot load. With a secret, the signature is verified (``hmac.compare_digest``) before anything
else in the frame is trusted, so ``loads`` never sees bytes that did not come from a holder of
the secret. A signed codec refuses unsigned frames: otherwise an attacker would simply strip the
signature.

``None`` is a value like any other and round-trips; a cache miss is the absence of a payload,
which is the caller's business.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import pickle
import struct
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["Codec", "Decoded", "PayloadError", "Serializer", "make_codec"]

MAGIC = b"RM"
VERSION = 1
FLAG_SIGNED = 0x01
_KIND_SHIFT = 1
_KIND_MASK = 0x06
_KNOWN_FLAGS = FLAG_SIGNED | _KIND_MASK
KIND_PICKLE, KIND_JSON, KIND_CUSTOM = 1, 2, 3

_HEADER = struct.Struct(">2sBBdI")  # magic, version, flags, delta, body length: 16 bytes
_CONTEXT_LENGTH = struct.Struct(">I")
_MAC_SIZE = hashlib.sha256().digest_size
_MAX_BODY = 0xFFFF_FFFF
PICKLE_PROTOCOL = 5  # fixed, not HIGHEST_PROTOCOL: every Python >= 3.10 process must read it


class PayloadError(ValueError):
    """A stored payload is malformed, of an unknown version, or fails the signature check.

    The cache treats it as a miss (and logs it); it never reaches the user as a value.
    """


@runtime_checkable
class Serializer(Protocol):
    """What ``serializer=`` accepts besides "pickle" and "json"."""

    def dumps(self, obj: Any, /) -> bytes | str: ...

    def loads(self, data: bytes, /) -> Any: ...


class Decoded(NamedTuple):
    """A decoded payload: the cached value and the fill duration δ in seconds."""

    value: Any
    delta: float


class _Pickle:
    @staticmethod
    def dumps(obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)

    @staticmethod
    def loads(data: bytes) -> Any:
        return pickle.loads(data)


class _Json:
    @staticmethod
    def dumps(obj: Any) -> bytes:
        # ensure_ascii keeps lone surrogates encodable; compact separators save bytes in Redis.
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @staticmethod
    def loads(data: bytes) -> Any:
        return json.loads(data)


def _context_bytes(context: bytes | str) -> bytes:
    if isinstance(context, str):
        return context.encode("utf-8", "surrogatepass")
    if isinstance(context, bytes):
        return context
    raise TypeError(f"context must be bytes or str, not {type(context).__name__}")


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise TypeError(f"delta must be a number of seconds, not {type(delta).__name__}")
    delta = float(delta)
    if not math.isfinite(delta) or delta < 0:
        raise ValueError(f"delta must be a finite number of seconds >= 0, not {delta!r}")
    return delta


class Codec:
    """Turns values into signed (or unsigned) frames and back; see the module docstring.

    Build one with ``make_codec``. Safe to share between threads: it holds no mutable state.
    """

    __slots__ = ("_dumps", "_kind", "_loads", "_secret", "serializer_name")

    def __init__(self, serializer: Serializer, kind: int, name: str, secret: bytes | None):
        self._dumps = serializer.dumps
        self._loads = serializer.loads
        self._kind = kind
        self._secret = secret
        self.serializer_name = name

    @property
    def signed(self) -> bool:
        """True when frames carry an HMAC-SHA256 (the codec was given a secret)."""
        return self._secret is not None

    def __repr__(self) -> str:  # never shows the secret
        return f"<Codec serializer={self.serializer_name!r} signed={self.signed}>"

    def encode(self, value: Any, delta: float = 0.0, *, context: bytes | str = b"") -> bytes:
        """The frame of ``value`` filled in ``delta`` seconds.

        Errors of the serializer (an unpicklable value, a non-JSON value) propagate unchanged:
        they are the caller's bug, not a bad payload.
        """
        return self._frame(self._serialize(value), delta, context)

    def encode_round_trip(
        self, value: Any, delta: float = 0.0, *, context: bytes | str = b""
    ) -> tuple[bytes, Any]:
        """``encode``, plus the value as every reader of the frame will see it: ``loads`` of the
        body just serialized (no second ``dumps``, no signature check of our own frame). A fill
        returns this, so its caller gets what later callers get (a JSON tuple comes back as a
        list). Errors of ``dumps`` or ``loads`` propagate unchanged: a serializer that cannot
        load what it dumped is the caller's bug, and nothing is stored."""
        body = self._serialize(value)
        return self._frame(body, delta, context), self._loads(body)

    def _frame(self, body: bytes, delta: float, context: bytes | str) -> bytes:
        delta = _check_delta(delta)
        if len(body) > _MAX_BODY:
            raise ValueError(f"the serialized value is too large ({len(body)} bytes)")
        flags = (self._kind << _KIND_SHIFT) | (FLAG_SIGNED if self._secret is not None else 0)
        frame = _HEADER.pack(MAGIC, VERSION, flags, delta, len(body)) + body
        if self._secret is None:
            return frame
        return frame + self._mac(_context_bytes(context), frame)

    def decode(
        self, payload: bytes | bytearray | memoryview, *, context: bytes | str = b""
    ) -> Decoded:
        """The value and δ stored in ``payload``; ``PayloadError`` unless this codec wrote it."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        payload = bytes(payload)
        context_bytes = _context_bytes(context)
        if len(payload) < _HEADER.size:
            raise PayloadError(f"truncated payload ({len(payload)} bytes)")
        magic, version, flags, delta, length = _HEADER.unpack_from(payload)
        if magic != MAGIC:
            raise PayloadError("not a redmutex payload (bad magic)")
        if version != VERSION:
            raise PayloadError(f"unknown payload version {version}")
        if flags & ~_KNOWN_FLAGS:
            raise PayloadError(f"unknown payload flags 0x{flags:02x}")
        body_end = self._check_signature(payload, flags, length, context_bytes)
        # From here on the frame is authentic (or the codec is unsigned and trusts Redis).
        if (flags & _KIND_MASK) >> _KIND_SHIFT != self._kind:
            raise PayloadError(f"payload was not written by the {self.serializer_name} serializer")
        if not math.isfinite(delta) or delta < 0:
            raise PayloadError(f"invalid fill duration {delta!r} in payload")
        return Decoded(self._deserialize(payload[_HEADER.size : body_end]), delta)

    def _check_signature(self, payload: bytes, flags: int, length: int, context: bytes) -> int:
        """Verifies length and signature; returns where the body ends."""
        signed = bool(flags & FLAG_SIGNED)
        if signed != (self._secret is not None):
            state = "a signed" if signed else "an unsigned"
            raise PayloadError(f"{state} payload does not match a codec with signed={self.signed}")
        body_end = _HEADER.size + length
        expected = body_end + (_MAC_SIZE if signed else 0)
        if len(payload) != expected:
            raise PayloadError(f"payload is {len(payload)} bytes, its header says {expected}")
        if signed:
            mac = self._mac(context, payload[:body_end])
            if not hmac.compare_digest(mac, payload[body_end:]):
                raise PayloadError("payload signature does not verify")
        return body_end

    def _mac(self, context: bytes, frame: bytes) -> bytes:
        assert self._secret is not None
        mac = hmac.new(self._secret, _CONTEXT_LENGTH.pack(len(context)), hashlib.sha256)
        mac.update(context)
        mac.update(frame)
        return mac.digest()

    def _serialize(self, value: Any) -> bytes:
        body = self._dumps(value)
        if isinstance(body, str):
            return body.encode("utf-8")
        if isinstance(body, (bytes, bytearray, memoryview)):
            return bytes(body)
        raise TypeError(
            f"serializer {self.serializer_name}: dumps() returned {type(body).__name__}, "
            "expected bytes or str"
        )

    def _deserialize(self, body: bytes) -> Any:
        try:
            return self._loads(body)
        except Exception as exc:  # any failure of loads means "not a value we can return"
            raise PayloadError(
                f"the {self.serializer_name} serializer cannot load the payload: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def _resolve_serializer(serializer: object) -> tuple[Serializer, int, str]:
    if isinstance(serializer, str):
        if serializer == "pickle":
            return _Pickle(), KIND_PICKLE, "pickle"
        if serializer == "json":
            return _Json(), KIND_JSON, "json"
        raise ValueError(
            f'serializer must be "pickle", "json" or an object with dumps() and loads(), '
            f"not {serializer!r}"
        )
    dumps = getattr(serializer, "dumps", None)
    loads = getattr(serializer, "loads", None)
    if not callable(dumps) or not callable(loads):
        raise TypeError(
            f'serializer must be "pickle", "json" or an object with dumps() and loads(), '
            f"not {type(serializer).__name__}"
        )
    name = getattr(serializer, "__name__", None) or type(serializer).__name__
    return serializer, KIND_CUSTOM, f"custom ({name})"  # type: ignore[return-value]


def make_codec(serializer: str | Serializer = "pickle", secret: bytes | None = None) -> Codec:
    """The codec for ``serializer=`` and ``secret=`` of ``get_or_fill``/``@cached``.

    Raises ``ValueError``/``TypeError`` naming ``serializer`` or ``secret`` for bad arguments;
    an empty secret is refused because it would sign with a key everybody knows.
    """
    resolved, kind, name = _resolve_serializer(serializer)
    if secret is not None:
        if not isinstance(secret, bytes):
            hint = " (encode it, e.g. secret.encode())" if isinstance(secret, str) else ""
            raise TypeError(f"secret must be bytes or None, not {type(secret).__name__}{hint}")
        if not secret:
            raise ValueError("secret must not be empty")
    return Codec(resolved, kind, name, secret)
