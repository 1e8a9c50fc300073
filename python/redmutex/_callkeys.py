"""Turning a function call into a lock name or a cache key.

Two decorators need a string per call: ``@locked(client, "lock:{sender}")`` names the lock after
the call's arguments, and ``@cached`` names the cache entry either from a template
(``key="user:{user_id}"``) or, with ``key=None``, from the call itself. Both are compiled once,
at decoration time, so that a typo in a template fails when the module is imported rather than
on the first call in production.

Templates (``compile_template``)
--------------------------------
``str.format`` syntax restricted to what a name needs:

* ``{param}`` is the value of the parameter ``param`` of the call, bound with
  ``inspect.signature(func).bind(*args, **kwargs)`` and ``apply_defaults()``, so positional,
  keyword and defaulted arguments all fill it; the value is formatted with ``str()``. A value
  whose class defines neither ``__str__`` nor ``__repr__`` raises ``TypeError`` at call time:
  its ``str()`` is its address (``<mod.User object at 0x...>``), a name per object and process
  (unless a format spec goes to the class's own ``__format__``, as in ``{amount:eur}``).
  A container is formatted with ``str()`` too, so a set or frozenset of strings lists its members
  in an order that differs between processes (hash randomization): pass a sorted tuple, or use
  ``key=None``, whose derived keys sort them.
* ``{param.attr}`` and ``{param[key]}`` (chained as in ``str.format``: ``[0]`` is an int index,
  ``[name]`` a str key) reach into an argument, e.g. ``"user:{self.id}"``. Attribute names that
  start with ``_`` are rejected, so a template cannot wander into ``__globals__`` and friends.
* ``{param:spec}`` applies a format spec (``{amount:.2f}``); ``!s`` is allowed, ``!r``/``!a`` are
  not (a repr may embed an ``id()``), nor are nested fields in a spec.
* ``{{`` and ``}}`` are literal braces. A template without placeholders yields the same string,
  its doubled braces undone, for every call: ``key="stats"`` names the same entry as
  ``get_or_fill(client, "stats", ...)``.

Derived keys (``derive_key``)
-----------------------------
The key must be the same in every process and every Python version, so it never uses
``hash()`` (salted per process), ``id()`` or ``repr()`` of arbitrary objects. Its format is::

    <module>.<qualname>(<param>=<value>, <param>=<value>, ...)

e.g. ``mymod.fetch(url='http://x', retries=3)``. The call is bound to the signature and defaults
are applied, so ``f(1)``, ``f(a=1)`` and ``f()`` (with ``a=1`` as default) give one key. Every
parameter appears in signature order, except an empty ``*args``/``**kwargs`` and a parameter
left at a default that has no encoding (a sentinel ``object()``), which are omitted; omission is
unambiguous because the parameter list is fixed by the signature. Values are encoded like Python
literals, with exactly one spelling per value:

==================  =====================================================================
``None``/bool       ``None``, ``True``, ``False``
int                 decimal (``42``, ``-7``); above 2000 bits lowercase hex (``0x...``)
float               shortest round-trip repr: ``1.0``, ``1e+100``, ``-0.0``, ``inf``, ``nan``
str                 ``'...'``; ``\\``, ``'``, C0/C1 controls and lone surrogates escaped
                    (``\\n``, ``\\t``, ``\\r``, ``\\xNN``, ``\\uNNNN``), everything else as is
bytes               ``b'...'``; printable ASCII as is, ``\\``/``'`` escaped, others ``\\xNN``
tuple, list         ``()``, ``(1,)``, ``(1, 2)``; ``[1, 2]``
dict                ``{k: v, ...}``, items sorted by (encoded key, encoded value)
set, frozenset      ``{1, 2}``/``set()``; ``frozenset({1, 2})``/``frozenset()``, members sorted
                    by their encoding
enum member         ``<module>.<EnumQualname>.<member name>``
==================  =====================================================================

Types are matched exactly, so ``1``, ``1.0``, ``True``, ``'1'`` and ``b'1'`` all differ, and a
subclass (a namedtuple, a ``str`` subclass) is rejected rather than silently equated with its
base value. Anything else raises ``TypeError`` naming the argument and suggesting ``key=``.

Methods: the first parameter of a function defined in a class body (its ``__qualname__`` says so)
is left out of the key when it is named ``self`` or ``cls`` (as dogpile.cache does), so
``Repo(1).load(5)`` and ``Repo(2).load(5)`` share the entry ``mymod.Repo.load(x=5)``; a key that
depends on the instance needs ``key=`` (a template such as ``"repo:{self.id}:{x}"`` or a key
function). The rule is read from the signature, not from how the call was made, so
``obj.load(5)`` and ``Repo.load(obj, 5)`` name one entry.

The name is the function's, not its identity: a lambda is refused (every lambda of a scope is
``<lambda>``), and functions that a factory makes (``make.<locals>.add``) share entries whatever
they close over, so give those ``key=``. A script's module is ``__main__`` also in the children
that multiprocessing spawns, where Python names it ``__mp_main__``.

A key longer than ``MAX_KEY_LENGTH`` (200) characters becomes its first ``_PREFIX_CHARS`` (120)
characters, ``...sha256:`` and the SHA-256 hex digest of the whole UTF-8 encoded key (194
characters in all). A short key always ends with ``)`` and a long one with a hex digit, so the
two forms never collide. Derived keys are valid Unicode (lone surrogates are escaped), so they
always encode to UTF-8.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import re
import string
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "MAX_KEY_LENGTH",
    "KeyFunction",
    "compile_key",
    "compile_template",
    "derive_key",
    "key_deriver",
]

KeyFunction = Callable[[tuple[Any, ...], dict[str, Any]], str]
"""Maps the ``(args, kwargs)`` of one call to its lock name or cache key."""

MAX_KEY_LENGTH = 200
_PREFIX_CHARS = 120
_INT_DECIMAL_BITS = 2000  # stays under the smallest allowed int-to-str digit limit (640)


def _describe(func: Callable[..., Any]) -> str:
    """A function's dotted name for error messages."""
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or repr(func)
    return f"{module}.{qualname}" if module else qualname


def _signature(func: Callable[..., Any], purpose: str) -> inspect.Signature:
    """The signature calls are bound to; a callable without one cannot fill names."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot read the signature of {_describe(func)} for {purpose}") from exc


# --------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------

_ROOT = re.compile(r"[^.\[]*")
_ACCESSOR = re.compile(r"\.([^.\[\]]*)|\[([^\[\]]*)\]")


class _Field:
    """One ``{param.attr[key]:spec}`` placeholder, validated and ready to render."""

    __slots__ = ("accessors", "param", "spec")

    def __init__(self, param: str, accessors: tuple[tuple[bool, str | int], ...], spec: str):
        self.param = param
        self.accessors = accessors  # (is_attribute, name or index), applied left to right
        self.spec = spec

    def render(self, arguments: dict[str, Any]) -> str:
        value = arguments[self.param]
        for is_attribute, name in self.accessors:
            value = getattr(value, name) if is_attribute else value[name]  # type: ignore[arg-type]
        kind = type(value)
        shown: tuple[Any, Any] = (kind.__str__, kind.__repr__)
        if shown[0] is object.__str__ and shown[1] is object.__repr__:
            # A spec goes to the class's own __format__, if it has one: not the address then.
            formats: Any = kind.__format__
            if not self.spec or formats is object.__format__:
                raise TypeError(self._addressed(kind))
        return format(value, self.spec) if self.spec else str(value)

    def _addressed(self, kind: type) -> str:
        """Why a value whose ``str()`` is ``<... object at 0x...>`` names nothing."""
        field = self.param + "".join(
            f".{name}" if is_attribute else f"[{name}]" for is_attribute, name in self.accessors
        )
        return (
            f"placeholder {{{field}}}: str() of a {kind.__module__}.{kind.__qualname__} is its "
            "address in memory (the class defines neither __str__ nor __repr__), another name "
            f"for every object and process; use an attribute, as in {{{field}.<attr>}}, give "
            "the class a __str__, or pass a key function"
        )


def _parse_field(field: str, fail: Callable[[str], ValueError]) -> tuple[str, list[Any]]:
    """Splits ``param.attr[key]`` into the parameter name and its accessors, as str.format does."""
    root = _ROOT.match(field)
    param = root.group() if root else ""
    accessors: list[tuple[bool, str | int]] = []
    pos = len(param)
    while pos < len(field):
        match = _ACCESSOR.match(field, pos)
        if match is None:
            raise fail(
                f"placeholder {{{field}}} is not of the form {{param}}, {{param.attr}} or "
                "{param[key]}"
            )
        attribute, key = match.groups()
        if attribute is not None:
            if not attribute.isidentifier() or attribute.startswith("_"):
                raise fail(
                    f"placeholder {{{field}}} uses attribute {attribute!r}; only public "
                    "attribute names (not starting with '_') are allowed"
                )
            accessors.append((True, attribute))
        else:
            if not key:
                raise fail(f"placeholder {{{field}}} has an empty index []")
            accessors.append((False, int(key) if key.isdigit() else key))
        pos = match.end()
    return param, accessors


class _Template:
    """A compiled template: literal text and fields, filled per call from bound arguments."""

    __slots__ = ("_constant", "_parts", "_signature", "fields", "template")

    def __init__(
        self,
        template: str,
        parts: list[str | _Field],
        signature: inspect.Signature | None,
    ) -> None:
        self.template = template
        self._parts = parts
        self._signature = signature
        self.fields = tuple(part.param for part in parts if isinstance(part, _Field))
        self._constant = "".join(parts) if signature is None else None  # type: ignore[arg-type]

    @property
    def is_constant(self) -> bool:
        """True when the template has no placeholders: every call gets the same string."""
        return self._constant is not None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self._constant is not None:
            return self._constant
        assert self._signature is not None
        bound = self._signature.bind(*args, **kwargs)  # TypeError, like the call itself would
        bound.apply_defaults()
        arguments = bound.arguments
        return "".join(
            part if isinstance(part, str) else part.render(arguments) for part in self._parts
        )

    def __repr__(self) -> str:
        return f"<template {self.template!r}>"


def compile_template(
    template: str, func: Callable[..., Any], *, argument: str = "template"
) -> KeyFunction:
    """Compiles ``template`` against ``func``'s parameters; the result maps (args, kwargs) to str.

    All validation happens here, at decoration time: an empty or malformed template, a placeholder naming
    no parameter of ``func``, a positional ``{}``/``{0}``, a ``!r`` conversion or a nested spec
    raise ``ValueError`` naming the placeholder and the function. ``argument`` is how messages
    call the template (``"name"`` for ``@locked``, ``"key"`` for ``@cached``).
    """
    if not isinstance(template, str):
        raise TypeError(f"{argument} must be a str, not {type(template).__name__}")
    if not template:  # names nothing: every call would raise
        raise ValueError(f"{argument} must not be empty ({_describe(func)})")
    where = f"{argument} {template!r} of {_describe(func)}"

    def fail(reason: str) -> ValueError:
        return ValueError(f"{where}: {reason}")

    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(
            f"{where} is malformed ({exc}); write literal braces as {{{{ and }}}}"
        ) from exc

    parts: list[str | _Field] = []
    fields: list[tuple[str, str]] = []  # (placeholder text, parameter name)
    for literal, field, spec, conversion in parsed:
        if literal:
            parts.append(literal)
        if field is None:
            continue
        param, accessors = _parse_field(field, fail)
        if not param.isidentifier():
            raise fail(f"placeholder {{{field}}} must name a parameter, like {{user_id}}")
        if conversion not in (None, "s"):
            raise fail(
                f"placeholder {{{field}}} uses !{conversion}; values are formatted with "
                "str(), only !s is allowed"
            )
        if "{" in (spec or ""):
            raise fail(f"placeholder {{{field}}} has a nested field in its format spec")
        fields.append((field, param))
        parts.append(_Field(param, tuple(accessors), spec or ""))

    if not fields:
        return _Template(template, parts, None)
    signature = _signature(func, f"{argument} {template!r}")
    known = signature.parameters
    for field, param in fields:
        if param not in known:
            names = ", ".join(known) or "none"
            raise fail(
                f"placeholder {{{field}}} names no parameter of {_describe(func)} "
                f"(its parameters: {names})"
            )
    return _Template(template, parts, signature)


# --------------------------------------------------------------------------------------------
# Derived keys
# --------------------------------------------------------------------------------------------


class _Unencodable(TypeError):
    """Raised inside the encoder; the deriver turns it into a message naming the argument."""


_STR_NAMED = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_STR_SPECIAL = re.compile(r"[\\'\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_BYTES_SPECIAL = re.compile(rb"[^\x20-\x7e]|[\\']")


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    named = _STR_NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escape_byte(match: re.Match[bytes]) -> bytes:
    byte = match.group()
    named = _STR_NAMED.get(byte.decode("latin-1"))
    return named.encode("ascii") if named is not None else b"\\x%02x" % byte[0]


def _encode_int(value: int) -> str:
    """Decimal for readability; hex for huge ints, which no int-to-str digit limit refuses."""
    if value.bit_length() <= _INT_DECIMAL_BITS:
        return str(value)
    return hex(value)


def _encode_str(value: str) -> str:
    # Our own escaping rather than repr(): repr depends on the Unicode database's idea of
    # "printable", which changes between Python versions.
    return "'" + _STR_SPECIAL.sub(_escape_char, value) + "'"


def _encode_bytes(value: bytes) -> str:
    return "b'" + _BYTES_SPECIAL.sub(_escape_byte, value).decode("ascii") + "'"


_SCALARS: dict[type, Callable[[Any], str]] = {
    type(None): lambda _value: "None",
    bool: repr,
    int: _encode_int,
    float: float.__repr__,
    str: _encode_str,
    bytes: _encode_bytes,
}


def _encode(value: object, active: set[int]) -> str:
    """The canonical encoding of one value (see the module docstring)."""
    scalar = _SCALARS.get(type(value))
    if scalar is not None:
        return scalar(value)
    if isinstance(value, enum.Enum):
        cls = type(value)
        return f"{cls.__module__}.{cls.__qualname__}.{value.name}"
    kind = type(value)
    if kind not in (tuple, list, dict, set, frozenset):
        raise _Unencodable(
            f"a {kind.__module__}.{kind.__qualname__}, which has no encoding that is the same "
            "in every process"
        )
    if id(value) in active:  # id() only detects a cycle; it never reaches the key
        raise _Unencodable(f"a {kind.__name__} that contains itself")
    active.add(id(value))
    try:
        return _encode_container(value, active)
    finally:
        active.discard(id(value))


def _encode_container(value: Any, active: set[int]) -> str:
    if type(value) is tuple:
        items = [_encode(item, active) for item in value]
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if type(value) is list:
        return "[" + ", ".join(_encode(item, active) for item in value) + "]"
    if type(value) is dict:
        pairs = sorted((_encode(k, active), _encode(v, active)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    members = _sorted_members(value, active)
    if type(value) is set:
        return "{" + members + "}" if members else "set()"
    return "frozenset({" + members + "})" if members else "frozenset()"


def _sorted_members(members: Iterable[Any], active: set[int]) -> str:
    # Set iteration order follows hash(), which is salted per process: sort the encodings.
    return ", ".join(sorted(_encode(member, active) for member in members))


def _shorten(key: str) -> str:
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return f"{key[:_PREFIX_CHARS]}...sha256:{digest}"


def _defined_in_a_class(qualname: str) -> bool:
    """Whether a ``__qualname__`` is that of a function defined in a class body."""
    outer = qualname.rsplit(".", 2)
    return len(outer) >= 2 and outer[-2] != "<locals>"


def method_receiver(func: Callable[..., Any], signature: inspect.Signature) -> str | None:
    """The name of a method's ``self``/``cls`` parameter, left out of derived keys; None when
    ``func`` is not a method by the rule in the module docstring."""
    first = next(iter(signature.parameters.values()), None)
    if first is None or first.name not in ("self", "cls"):
        return None
    if first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        return None
    qualname = getattr(func, "__qualname__", None)
    return first.name if isinstance(qualname, str) and _defined_in_a_class(qualname) else None


class _Deriver:
    """Derives keys for one function; the signature is read once, at decoration time."""

    __slots__ = ("_name", "_signature", "_skip")

    def __init__(self, func: Callable[..., Any], receiver: bool | None = None) -> None:
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str):
            raise TypeError(
                f"cannot derive cache keys for {func!r}: it has no __module__ and __qualname__ "
                "(pass key=... to @cached)"
            )
        if "<lambda>" in qualname.split("."):
            raise TypeError(
                f"cannot derive cache keys for the lambda {module}.{qualname}: every lambda of "
                "that scope has this name, so they would share entries (pass key=... to @cached)"
            )
        # A script run directly is `__main__`, but `__mp_main__` in the children that
        # multiprocessing spawns (or forks from a server): one module, one key.
        if module == "__mp_main__":
            module = "__main__"
        self._name = f"{module}.{qualname}"
        self._signature = _signature(func, "deriving cache keys (pass key=... to @cached)")
        # receiver: True/False when the caller knows (a classmethod/staticmethod), else the rule.
        if receiver is None:
            self._skip = method_receiver(func, self._signature)
        else:
            first = next(iter(self._signature.parameters), None)
            self._skip = first if receiver else None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        bound = self._signature.bind(*args, **kwargs)  # TypeError, like the call itself would
        bound.apply_defaults()
        encoded = []
        for name, value in bound.arguments.items():
            if name == self._skip:
                continue
            text = self._encode_argument(self._signature.parameters[name], value)
            if text is not None:
                encoded.append(f"{name}={text}")
        return _shorten(f"{self._name}({', '.join(encoded)})")

    def _encode_argument(self, parameter: inspect.Parameter, value: Any) -> str | None:
        """One argument's encoding, or None when it is omitted (see the module docstring)."""
        variadic = parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        if variadic and not value:
            return None
        try:
            return _encode(value, set())
        except _Unencodable as exc:
            if value is parameter.default:
                return None  # left at a default without an encoding (a sentinel object())
            raise TypeError(
                f"cannot derive a cache key for {self._name}: argument {parameter.name!r} is or "
                f'contains {exc}; pass key="..." to @cached, a template such as '
                '"user:{user_id}" filled from the call\'s arguments'
            ) from None

    def __repr__(self) -> str:
        return f"<derived key of {self._name}>"


def key_deriver(func: Callable[..., Any], receiver: bool | None = None) -> KeyFunction:
    """Validates ``func`` once and returns the (args, kwargs) -> key function for it.
    ``receiver``: whether the first parameter is a ``self``/``cls`` to leave out (None: decide
    by the rule in the module docstring)."""
    return _Deriver(func, receiver)


def derive_key(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The cache key of the call ``func(*args, **kwargs)``, the same in every process.

    Raises ``TypeError`` for arguments without a process-independent encoding, and the
    ``TypeError`` of ``inspect.Signature.bind`` when the arguments do not fit the signature.
    """
    return _Deriver(func)(args, kwargs)


def _user_key(key: Callable[..., str], func: Callable[..., Any]) -> KeyFunction:
    """``key=`` a callable: called with the call's own arguments, it returns the key string."""

    def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        name = key(*args, **kwargs)
        if not isinstance(name, str):
            raise TypeError(
                f"key: the key function of {_describe(func)} returned "
                f"{type(name).__name__}, expected a str"
            )
        return name

    return key_of


def compile_key(
    key: str | Callable[..., str] | None, func: Callable[..., Any], receiver: bool | None = None
) -> KeyFunction:
    """The key function of ``@cached(key=...)``: a template for a str, derived keys for None,
    and for a callable, whatever it returns when called with the call's arguments."""
    if key is None:
        return key_deriver(func, receiver)
    if isinstance(key, str):
        return compile_template(key, func, argument="key")
    if callable(key):
        return _user_key(key, func)
    raise TypeError(f"key must be a str, a callable or None, not {type(key).__name__}")
