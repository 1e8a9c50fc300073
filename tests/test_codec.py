"""Unit tests of redmutex._codec: frames, serializers and HMAC signing of cached values."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import pickle
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redmutex._codec import Codec, Decoded, PayloadError, make_codec

SECRET = b"correct horse battery staple"

# --------------------------------------------------------------------------------------------
# A value whose unpickling is detectable: it calls _record_unpickling.
# --------------------------------------------------------------------------------------------

UNPICKLED: list[str] = []


def _record_unpickling(tag: str) -> str:
    UNPICKLED.append(tag)
    return tag


class Booby:
    """Pickles to a call of _record_unpickling: an attacker's payload, harmlessly."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_record_unpickling, ("booby",))


@pytest.fixture
def unpickled() -> list[str]:
    UNPICKLED.clear()
    return UNPICKLED


def _flip(payload: bytes, index: int, mask: int) -> bytes:
    return payload[:index] + bytes([payload[index] ^ mask]) + payload[index + 1 :]


def _frame(
    *,
    flags: int,
    body: bytes,
    delta: float = 0.0,
    version: int = 1,
    magic: bytes = b"RM",
    secret: bytes | None = None,
    context: bytes = b"",
) -> bytes:
    """Builds a frame by hand, as another implementation (or an attacker) would."""
    frame = struct.pack(">2sBBdI", magic, version, flags, delta, len(body)) + body
    if secret is not None:
        frame += hmac.new(
            secret, struct.pack(">I", len(context)) + context + frame, hashlib.sha256
        ).digest()
    return frame


# --------------------------------------------------------------------------------------------
# make_codec
# --------------------------------------------------------------------------------------------


def test_make_codec_accepts_the_documented_serializers() -> None:
    assert make_codec("pickle").serializer_name == "pickle"
    assert make_codec("json", None).serializer_name == "json"
    assert make_codec(json).serializer_name == "custom (json)"
    assert make_codec(pickle, SECRET).signed
    assert not make_codec("pickle").signed


@pytest.mark.parametrize(
    ("serializer", "error"),
    [("yaml", ValueError), ("JSON", ValueError), ("", ValueError), (None, TypeError)],
)
def test_make_codec_rejects_unknown_serializers(serializer: Any, error: type) -> None:
    with pytest.raises(error, match="^serializer must be"):
        make_codec(serializer)


class _OnlyDumps:
    def dumps(self, obj: Any) -> bytes:
        return b""


class _NotCallable:
    dumps = b"x"
    loads = b"y"


@pytest.mark.parametrize("serializer", [42, object(), _OnlyDumps(), _NotCallable(), b"pickle"])
def test_make_codec_rejects_objects_without_dumps_and_loads(serializer: Any) -> None:
    with pytest.raises(TypeError, match="^serializer must be"):
        make_codec(serializer)


@pytest.mark.parametrize("secret", ["text", bytearray(b"x"), memoryview(b"x"), 1, True])
def test_make_codec_rejects_a_secret_that_is_not_bytes(secret: Any) -> None:
    with pytest.raises(TypeError, match="^secret must be bytes"):
        make_codec("pickle", secret)


def test_make_codec_rejects_an_empty_secret_and_hints_at_encoding_text() -> None:
    with pytest.raises(ValueError, match="^secret must not be empty"):
        make_codec("pickle", b"")
    with pytest.raises(TypeError, match=r"secret\.encode\(\)"):
        make_codec("pickle", "text")  # type: ignore[arg-type]


def test_repr_never_shows_the_secret() -> None:
    codec = make_codec("json", SECRET)
    assert "correct horse" not in repr(codec)
    assert "signed=True" in repr(codec)


# --------------------------------------------------------------------------------------------
# Round trips and the frame layout
# --------------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_pickle_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text() | st.integers(), inner, max_size=4)
        | st.frozensets(st.integers() | st.text(), max_size=4)
    ),
    max_leaves=12,
)
_deltas = st.floats(min_value=0, allow_infinity=False, allow_nan=False)
_secrets = st.none() | st.binary(min_size=1, max_size=64)


@given(_pickle_values, _deltas, _secrets)
def test_pickle_round_trip(value: Any, delta: float, secret: bytes | None) -> None:
    codec = make_codec("pickle", secret)
    assert codec.decode(codec.encode(value, delta)) == (value, delta)


@given(_json_values, _deltas, _secrets)
def test_json_round_trip(value: Any, delta: float, secret: bytes | None) -> None:
    codec = make_codec("json", secret)
    assert codec.decode(codec.encode(value, delta)) == (value, delta)


@given(_json_values | st.tuples(st.integers(), st.text()), _deltas, _secrets)
def test_encode_round_trip_gives_what_a_reader_decodes(
    value: Any, delta: float, secret: bytes | None
) -> None:
    codec = make_codec("json", secret)
    payload, seen = codec.encode_round_trip(value, delta, context="k")
    assert payload == codec.encode(value, delta, context="k")
    assert codec.decode(payload, context="k") == (seen, delta)


@pytest.mark.parametrize("serializer", ["pickle", "json"])
@pytest.mark.parametrize("secret", [None, SECRET])
def test_none_is_a_value(serializer: str, secret: bytes | None) -> None:
    codec = make_codec(serializer, secret)
    decoded = codec.decode(codec.encode(None, 0.25))
    assert isinstance(decoded, Decoded)
    assert decoded.value is None
    assert decoded.delta == 0.25
    value, delta = decoded  # a plain pair too
    assert (value, delta) == (None, 0.25)


def test_pickle_keeps_types_json_does_what_json_does() -> None:
    value = {"t": (1, 2), "s": frozenset({3}), "b": b"\x00"}
    assert make_codec("pickle").decode(make_codec("pickle").encode(value)).value == value
    codec = make_codec("json")
    assert codec.decode(codec.encode({"t": (1, 2)})).value == {"t": [1, 2]}
    assert codec.decode(codec.encode("\ud800 é")).value == "\ud800 é"  # lone surrogate survives


def test_frame_layout_unsigned() -> None:
    payload = make_codec("json").encode(None, 1.5)
    assert payload == b"RM\x01\x04" + struct.pack(">d", 1.5) + b"\x00\x00\x00\x04" + b"null"
    assert payload == _frame(flags=0x04, body=b"null", delta=1.5)


def test_frame_layout_signed() -> None:
    payload = make_codec("json", SECRET).encode([1], 0.0, context="user:1")
    unsigned = b"RM\x01\x05" + bytes(8) + b"\x00\x00\x00\x03" + b"[1]"
    mac = hmac.new(SECRET, b"\x00\x00\x00\x06user:1" + unsigned, hashlib.sha256).digest()
    assert payload == unsigned + mac
    assert payload == _frame(flags=0x05, body=b"[1]", secret=SECRET, context=b"user:1")


def test_frame_flags_name_the_serializer() -> None:
    assert make_codec("pickle").encode(1)[3] == 0x02
    assert make_codec("json").encode(1)[3] == 0x04
    assert make_codec(json).encode(1)[3] == 0x06
    assert make_codec("pickle", SECRET).encode(1)[3] == 0x03


def test_delta_is_stored_exactly() -> None:
    codec = make_codec("pickle")
    for delta in (0, 0.0, 5e-324, 0.001, 1 / 3, 86400.0, 1e300):
        assert codec.decode(codec.encode("v", delta)).delta == delta


@pytest.mark.parametrize(
    ("delta", "error"),
    [
        (-0.001, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("1", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_encode_rejects_a_bad_delta(delta: Any, error: type) -> None:
    with pytest.raises(error, match="^delta must be"):
        make_codec("pickle").encode("v", delta)


def test_custom_serializer_may_return_str_and_receives_bytes() -> None:
    seen: list[object] = []

    class Upper:
        def dumps(self, obj: Any) -> str:
            return str(obj).upper()

        def loads(self, data: bytes) -> str:
            seen.append(data)
            return data.decode().lower()

    codec = make_codec(Upper(), SECRET)
    assert codec.decode(codec.encode("héllo")).value == "héllo"
    assert seen == ["HÉLLO".encode()]
    assert codec.serializer_name == "custom (Upper)"


def test_module_serializers_work_as_custom_objects() -> None:
    codec = make_codec(json)  # json.dumps returns str
    assert codec.decode(codec.encode({"a": [1]})).value == {"a": [1]}


def test_custom_dumps_returning_something_else_is_a_type_error() -> None:
    class Bad:
        def dumps(self, obj: Any) -> int:
            return 42

        def loads(self, data: bytes) -> Any:
            return data

    with pytest.raises(TypeError, match=r"serializer custom \(Bad\): dumps\(\) returned int"):
        make_codec(Bad()).encode("v")  # type: ignore[arg-type]


def test_serializer_errors_while_encoding_propagate_unchanged() -> None:
    with pytest.raises(TypeError, match="JSON serializable"):
        make_codec("json").encode(object())
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        make_codec("pickle").encode(lambda: None)


def test_decode_accepts_bytes_like_and_rejects_other_types() -> None:
    codec = make_codec("json")
    payload = codec.encode([1, 2])
    assert codec.decode(bytearray(payload)).value == [1, 2]
    assert codec.decode(memoryview(payload)).value == [1, 2]
    with pytest.raises(TypeError, match="^payload must be bytes"):
        codec.decode(payload.decode("latin-1"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^context must be"):
        codec.decode(payload, context=1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Tampering: a signed codec never unpickles what it did not sign
# --------------------------------------------------------------------------------------------


def test_the_booby_trap_is_detectable(unpickled: list[str]) -> None:
    """Positive control: decoding the authentic payload does run the side effect."""
    codec = make_codec("pickle", SECRET)
    assert codec.decode(codec.encode(Booby(), 0.5)) == ("booby", 0.5)
    assert unpickled == ["booby"]


def test_every_flipped_bit_is_rejected_before_unpickling(unpickled: list[str]) -> None:
    codec = make_codec("pickle", SECRET)
    payload = codec.encode(Booby(), 0.5, context=b"key")
    for index in range(len(payload)):
        for bit in range(8):
            tampered = _flip(payload, index, 1 << bit)
            with pytest.raises(PayloadError):
                codec.decode(tampered, context=b"key")
        with pytest.raises(PayloadError):
            codec.decode(_flip(payload, index, 0xFF), context=b"key")
    assert unpickled == []


def test_a_wrong_secret_is_rejected_before_unpickling(unpickled: list[str]) -> None:
    payload = make_codec("pickle", SECRET).encode(Booby())
    # (HMAC pads short keys with zeros, so SECRET + b"\0" would be the same key: not tested.)
    for secret in (b"wrong", SECRET[:-1], SECRET[:-1] + b"E", SECRET + b"!"):
        with pytest.raises(PayloadError, match="signature"):
            make_codec("pickle", secret).decode(payload)
    assert unpickled == []


def test_a_payload_moved_to_another_key_is_rejected(unpickled: list[str]) -> None:
    codec = make_codec("pickle", SECRET)
    payload = codec.encode(Booby(), context="user:1")
    with pytest.raises(PayloadError, match="signature"):
        codec.decode(payload, context="user:2")
    with pytest.raises(PayloadError, match="signature"):
        codec.decode(payload)
    assert unpickled == []
    assert codec.decode(payload, context=b"user:1").value == "booby"


def test_an_unsigned_forgery_is_rejected_by_a_signed_codec(unpickled: list[str]) -> None:
    """Stripping the signature (downgrade) does not work."""
    forged = make_codec("pickle").encode(Booby())
    with pytest.raises(PayloadError, match="unsigned"):
        make_codec("pickle", SECRET).decode(forged)
    signed = make_codec("pickle", SECRET).encode(Booby())
    stripped = _flip(signed[:-32], 3, 0x01)  # clear the signed flag, drop the MAC
    with pytest.raises(PayloadError):
        make_codec("pickle", SECRET).decode(stripped)
    assert unpickled == []


def test_a_signed_payload_is_rejected_by_an_unsigned_codec(unpickled: list[str]) -> None:
    payload = make_codec("pickle", SECRET).encode(Booby())
    with pytest.raises(PayloadError, match="signed"):
        make_codec("pickle").decode(payload)
    assert unpickled == []


def test_a_json_codec_never_unpickles(unpickled: list[str]) -> None:
    payload = make_codec("pickle").encode(Booby())
    with pytest.raises(PayloadError, match="json"):
        make_codec("json").decode(payload)
    payload = make_codec("json").encode([1])
    with pytest.raises(PayloadError, match="pickle"):
        make_codec("pickle").decode(payload)
    assert unpickled == []


@given(st.binary(max_size=200))
def test_random_bytes_never_reach_pickle_with_a_secret(data: bytes) -> None:
    UNPICKLED.clear()
    codec = make_codec("pickle", SECRET)
    for payload in (data, b"RM\x01\x03" + data, _frame(flags=0x03, body=data) + bytes(32)):
        with pytest.raises(PayloadError):
            codec.decode(payload)
    assert UNPICKLED == []


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_payload_error(data: bytes) -> None:
    """Whatever the bytes, decode returns a value or raises PayloadError, nothing else.

    (An unsigned pickle codec is only fed bytes without a valid header: unpickling arbitrary
    bytes is exactly what `secret` exists to prevent.)
    """
    codec = make_codec("json")
    for payload in (data, b"RM\x01\x04" + data, _frame(flags=0x04, body=data)):
        with contextlib.suppress(PayloadError):
            codec.decode(payload)
    if not data.startswith(b"RM"):
        with pytest.raises(PayloadError):
            make_codec("pickle").decode(data)


# --------------------------------------------------------------------------------------------
# Malformed frames
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("serializer", ["pickle", "json"])
@pytest.mark.parametrize("secret", [None, SECRET])
def test_every_truncation_and_any_extension_is_rejected(
    serializer: str, secret: bytes | None
) -> None:
    codec = make_codec(serializer, secret)
    payload = codec.encode({"numbers": [12345, 678.5], "text": "abc"}, 2.0)
    for end in range(len(payload)):
        with pytest.raises(PayloadError):
            codec.decode(payload[:end])
    for extra in (b"\x00", b"x" * 40):
        with pytest.raises(PayloadError, match="bytes"):
            codec.decode(payload + extra)


def test_truncated_json_that_would_still_parse_is_rejected() -> None:
    codec = make_codec("json")
    payload = codec.encode(123456)
    assert json.loads(payload[16:-1]) == 12345  # the body alone would not notice
    with pytest.raises(PayloadError, match="header says"):
        codec.decode(payload[:-1])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "truncated"),
        (b"RM\x01", "truncated"),
        (_frame(flags=0x04, body=b"1", magic=b"XX"), "magic"),
        (_frame(flags=0x04, body=b"1", magic=b"rm"), "magic"),
        (_frame(flags=0x04, body=b"1", version=0), "version 0"),
        (_frame(flags=0x04, body=b"1", version=2), "version 2"),
        (_frame(flags=0x04, body=b"1", version=255), "version 255"),
        (_frame(flags=0x0C, body=b"1"), "flags 0x0c"),
        (_frame(flags=0x84, body=b"1"), "flags 0x84"),
        (_frame(flags=0x00, body=b"1"), "json serializer"),
        (_frame(flags=0x06, body=b"1"), "json serializer"),
        (_frame(flags=0x04, body=b"1", delta=math.nan), "fill duration"),
        (_frame(flags=0x04, body=b"1", delta=-1.0), "fill duration"),
        (_frame(flags=0x04, body=b"1", delta=math.inf), "fill duration"),
        (_frame(flags=0x04, body=b"{"), "cannot load"),
        (_frame(flags=0x04, body=b"\xff\xfe\x00"), "cannot load"),
    ],
)
def test_malformed_unsigned_frames(payload: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        make_codec("json").decode(payload)


def test_a_validly_signed_frame_with_a_bad_delta_is_still_rejected() -> None:
    forged = _frame(flags=0x05, body=b"1", delta=math.nan, secret=SECRET)
    with pytest.raises(PayloadError, match="fill duration"):
        make_codec("json", SECRET).decode(forged)


def test_a_signed_frame_of_a_newer_version_is_rejected_by_version() -> None:
    newer = _frame(flags=0x05, body=b"1", version=2, secret=SECRET)
    with pytest.raises(PayloadError, match="unknown payload version 2"):
        make_codec("json", SECRET).decode(newer)


def test_a_failing_loads_becomes_payload_error_with_its_cause() -> None:
    class Fragile:
        def dumps(self, obj: Any) -> bytes:
            return b"x"

        def loads(self, data: bytes) -> Any:
            raise RuntimeError("boom")

    codec = make_codec(Fragile())
    with pytest.raises(PayloadError, match="RuntimeError: boom") as info:
        codec.decode(codec.encode(1))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_payload_error_is_a_value_error() -> None:
    assert issubclass(PayloadError, ValueError)
    assert isinstance(make_codec("json"), Codec)
