"""A small declarative schema engine: each message's layout is declared once, codecs are derived from it.

Theory of operation
-------------------
Kafka describes every message as a list of fields, each present in a range of versions (its JSON message
definitions).  Here a message is a ``@dataclass(slots=True)`` subclass of :class:`Struct` whose attributes
are declared with :func:`wire`::

    @dataclass(slots=True)
    class FetchPartition(Struct):
        partition: int = wire(INT32)
        current_leader_epoch: int = wire(INT32, "9+", default=-1)
        fetch_offset: int = wire(INT64)

The attribute order is the wire order.  A field outside its version range is not on the wire and decodes
to its default.  ``nullable=`` names the versions in which null (None) is allowed; ``tag=`` makes the
field a tagged field in flexible versions.  Kinds are :data:`INT8` ... :data:`INT64`, :data:`BOOL`,
:data:`STRING`, :data:`BYTES` (decoded as ``bytes``), :data:`RECORDS` (decoded as a zero-copy
``memoryview``; encodes ``bytes``, ``memoryview`` or a :class:`FileRegion`) and ``ARRAY(kind_or_struct)``.

For each ``(struct class, version, flexible)`` the engine compiles, once and lazily, a decoder and an
encoder: a list of small closures, one per field, where consecutive fixed-size fields are merged into one
``struct.Struct`` (so a Fetch partition's five integers are one ``unpack_from``), and an array of structs
that are entirely fixed-size at that version is decoded with one ``iter_unpack`` over its slice.

Decoders raise only :class:`ProtocolError` (with the position and what was expected); encoders raise
``ValueError`` naming the struct and field when a value does not fit its declared kind.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar

from ipc.kafka import primitives as p
from ipc.kafka.regions import FileRegion
from storage.errors import ProtocolError

__all__ = [
    "ARRAY",
    "BOOL",
    "BYTES",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "MAX_VERSION",
    "RECORDS",
    "STRING",
    "UINT32",
    "Array",
    "FieldSpec",
    "Kind",
    "Struct",
    "Writer",
    "decoder_for",
    "encoder_for",
    "field_specs",
    "parse_versions",
    "present_fields",
    "wire",
]

MAX_VERSION = 0x7FFF
VersionRange = tuple[int, int]  # inclusive; lo > hi means "no version"

Reader = Callable[[memoryview, int], tuple[Any, int]]
FieldWriter = Callable[["Writer", Any], None]

# Bytes-valued records at least this large become their own part in encode_response_parts (no copy).
LARGE_BYTES_PART = 64 * 1024


def parse_versions(text: str) -> VersionRange:
    """Kafka's version-range syntax: ``"3+"``, ``"2-4"``, ``"5"``, ``"none"``."""
    text = text.strip()
    if text == "none":
        return (1, 0)
    if text.endswith("+"):
        return (int(text[:-1]), MAX_VERSION)
    if "-" in text:
        lo, hi = text.split("-")
        return (int(lo), int(hi))
    return (int(text), int(text))


def _in(version: int, versions: VersionRange) -> bool:
    return versions[0] <= version <= versions[1]


# -- kinds -----------------------------------------------------------------------------------------------


class Kind:
    """How one value is laid out on the wire.  ``fmt`` is a struct format character for fixed-size kinds."""

    __slots__ = ("default", "fmt", "name")

    def __init__(self, name: str, fmt: str | None, default: Any) -> None:
        self.name = name
        self.fmt = fmt
        self.default = default

    def __repr__(self) -> str:
        return self.name


INT8 = Kind("int8", "b", 0)
INT16 = Kind("int16", "h", 0)
INT32 = Kind("int32", "i", 0)
INT64 = Kind("int64", "q", 0)
UINT32 = Kind("uint32", "I", 0)
BOOL = Kind("bool", "?", False)
STRING = Kind("string", None, "")
BYTES = Kind("bytes", None, b"")
RECORDS = Kind("records", None, None)


class Array(Kind):
    """An array of a kind or of a :class:`Struct` subclass."""

    __slots__ = ("element",)

    def __init__(self, element: Kind | type[Struct]) -> None:
        name = element.name if isinstance(element, Kind) else element.__name__
        super().__init__(f"[]{name}", None, None)
        self.element = element


def ARRAY(element: Kind | type[Struct]) -> Array:
    return Array(element)


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a struct as declared with :func:`wire`."""

    name: str
    kind: Kind
    versions: VersionRange
    nullable_versions: VersionRange
    tag: int | None
    default: Any  # a value, or a zero-argument factory when ``default_is_factory``
    default_is_factory: bool

    def present(self, version: int) -> bool:
        return _in(version, self.versions)

    def nullable(self, version: int) -> bool:
        return _in(version, self.nullable_versions)

    def make_default(self) -> Any:
        return self.default() if self.default_is_factory else self.default


_WIRE = "kafka_wire"
_UNSET: Any = object()


def wire(
    kind: Kind, versions: str = "0+", *, nullable: str = "none", default: Any = _UNSET, tag: int | None = None
) -> Any:
    """Declare a dataclass attribute as a wire field.  ``default`` defaults to the kind's zero value
    (``0``, ``False``, ``""``, ``b""``, ``None`` for records, ``[]`` for arrays)."""
    array_factory = isinstance(kind, Array) and default is _UNSET
    if default is _UNSET:
        default = kind.default
    spec = FieldSpec("", kind, parse_versions(versions), parse_versions(nullable), tag,
                     list if array_factory else default, array_factory)
    if array_factory:
        return dataclasses.field(default_factory=list, metadata={_WIRE: spec})
    return dataclasses.field(default=default, metadata={_WIRE: spec})


class Struct:
    """Base of every message and nested structure.  Subclasses are ``@dataclass(slots=True)``."""

    __slots__ = ()


S = TypeVar("S", bound=Struct)

_SPECS: dict[type, tuple[FieldSpec, ...]] = {}


def field_specs(cls: type[Struct]) -> tuple[FieldSpec, ...]:
    """The declared fields of ``cls``, in wire order."""
    specs = _SPECS.get(cls)
    if specs is None:
        specs = tuple(
            dataclasses.replace(f.metadata[_WIRE], name=f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        )
        _SPECS[cls] = specs
    return specs


def present_fields(cls: type[Struct], version: int, flexible: bool) -> list[FieldSpec]:
    """Fields on the wire at ``version`` (tagged fields only when flexible)."""
    return [s for s in field_specs(cls) if s.present(version) and (s.tag is None or flexible)]


# -- the writer ------------------------------------------------------------------------------------------


class Writer:
    """Accumulates encoded bytes; large record bytes and file regions become separate parts."""

    __slots__ = ("buf", "parts")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.parts: list[bytearray | bytes | FileRegion] = []

    def add_part(self, part: bytes | FileRegion) -> None:
        if self.buf:
            self.parts.append(self.buf)
            self.buf = bytearray()
        self.parts.append(part)

    def all_parts(self) -> list[bytearray | bytes | FileRegion]:
        if self.buf or not self.parts:
            self.parts.append(self.buf)
            self.buf = bytearray()
        return self.parts


# -- decoders --------------------------------------------------------------------------------------------

_DECODERS: dict[tuple[type, int, bool], Callable[[memoryview, int], tuple[Any, int]]] = {}
_ENCODERS: dict[tuple[type, int, bool], Callable[[Writer, Any], None]] = {}
_MIN_BYTES: dict[tuple[type, int, bool], int] = {}
_FIXED: dict[tuple[type, int, bool], Any] = {}


def min_struct_bytes(cls: type[Struct], version: int, flexible: bool) -> int:
    key = (cls, version, flexible)
    n = _MIN_BYTES.get(key)
    if n is None:
        n = sum(_min_bytes(s.kind, flexible) for s in present_fields(cls, version, flexible) if s.tag is None)
        n += 1 if flexible else 0  # the tagged-fields count
        _MIN_BYTES[key] = n
    return n


def _min_bytes(kind: Kind, flexible: bool) -> int:
    if kind.fmt is not None:
        return struct.calcsize(">" + kind.fmt)
    if kind is STRING:
        return 1 if flexible else 2
    return 1 if flexible else 4  # bytes, records, arrays


FixedLayout = tuple[struct.Struct, Callable[..., Any]]


def _fixed_layout(cls: type[Struct], version: int, flexible: bool) -> FixedLayout | None:
    """If every field of ``cls`` on the wire at ``version`` is fixed-size: one Struct for the whole element
    and a function building the object from the unpacked tuple."""
    key = (cls, version, flexible)
    if key in _FIXED:
        return _FIXED[key]
    result: FixedLayout | None = None
    if not flexible:
        specs = field_specs(cls)
        present = [s for s in specs if s.present(version)]
        if present and all(s.kind.fmt is not None for s in present):
            layout = struct.Struct(">" + "".join(s.kind.fmt or "" for s in present))
            if len(present) == len(specs):
                maker: Callable[..., Any] = cls
            else:
                names = tuple(s.name for s in present)

                def maker(*values: Any, _names: tuple[str, ...] = names, _cls: type = cls) -> Any:
                    return _cls(**dict(zip(_names, values, strict=True)))

            result = (layout, maker)
    _FIXED[key] = result
    return result


def decoder_for(cls: type[S], version: int, flexible: bool) -> Callable[[memoryview, int], tuple[S, int]]:
    """The compiled decoder of ``cls`` at ``version``: ``decode(mv, pos) -> (obj, new_pos)``."""
    key = (cls, version, flexible)
    dec = _DECODERS.get(key)
    if dec is None:
        dec = _compile_decoder(cls, version, flexible)
        _DECODERS[key] = dec
    return dec


Step = Callable[[memoryview, int, list[Any]], int]


def _compile_decoder(cls: type[Struct], version: int, flexible: bool) -> Reader:
    steps: list[Step] = []
    run: list[FieldSpec] = []
    tagged: dict[int, tuple[int, Reader]] = {}  # tag -> (index in values, reader)

    def flush() -> None:
        if run:
            steps.append(_fixed_run_step(cls, list(run)))
            run.clear()

    for index, spec in enumerate(field_specs(cls)):
        on_wire = spec.present(version) and (spec.tag is None or flexible)
        if not on_wire or spec.tag is not None:
            flush()
            steps.append(_default_step(spec))
            if on_wire and spec.tag is not None:
                tagged[spec.tag] = (index, _reader(spec.kind, spec.nullable(version), version, flexible))
            continue
        if spec.kind.fmt is not None:
            run.append(spec)
            continue
        flush()
        steps.append(_value_step(_reader(spec.kind, spec.nullable(version), version, flexible)))
    flush()
    if flexible:
        steps.append(_tagged_step(cls, tagged))
    steps_t = tuple(steps)

    def decode(mv: memoryview, pos: int) -> tuple[Any, int]:
        values: list[Any] = []
        for step in steps_t:
            pos = step(mv, pos, values)
        return cls(*values), pos

    return decode


def _fixed_run_step(cls: type[Struct], run: list[FieldSpec]) -> Step:
    layout = struct.Struct(">" + "".join(s.kind.fmt or "" for s in run))
    size = layout.size
    unpack_from = layout.unpack_from
    what = f"{cls.__name__}.{run[0].name}" + (f"..{run[-1].name}" if len(run) > 1 else "")

    def step(mv: memoryview, pos: int, values: list[Any]) -> int:
        end = pos + size
        if end > len(mv):
            raise ProtocolError(
                f"truncated {what}: needs {size} bytes at position {pos}, only {len(mv) - pos} remain"
            )
        values.extend(unpack_from(mv, pos))
        return end

    return step


def _default_step(spec: FieldSpec) -> Step:
    if spec.default_is_factory:
        factory = spec.default

        def step_factory(mv: memoryview, pos: int, values: list[Any]) -> int:
            values.append(factory())
            return pos

        return step_factory
    value = spec.default

    def step(mv: memoryview, pos: int, values: list[Any]) -> int:
        values.append(value)
        return pos

    return step


def _value_step(reader: Reader) -> Step:
    def step(mv: memoryview, pos: int, values: list[Any]) -> int:
        value, pos = reader(mv, pos)
        values.append(value)
        return pos

    return step


def _tagged_step(cls: type[Struct], tagged: dict[int, tuple[int, Reader]]) -> Step:
    def step(mv: memoryview, pos: int, values: list[Any]) -> int:
        fields, end = p.read_tagged_fields(mv, pos)
        for tag, raw in fields.items():
            known = tagged.get(tag)
            if known is None:
                continue  # unknown tags are skipped, as Kafka's readers do
            index, reader = known
            sub = raw  # the tagged value must fill its declared size exactly
            value, used = reader(sub, 0)
            if used != len(sub):
                raise ProtocolError(
                    f"{cls.__name__} tagged field {tag}: value uses {used} of its {len(sub)} bytes"
                )
            values[index] = value
        return end

    return step


def _reader(kind: Kind, nullable: bool, version: int, flexible: bool) -> Reader:
    fmt = kind.fmt
    if fmt is not None:
        scalar = struct.Struct(">" + fmt)
        size = scalar.size
        unpack_from = scalar.unpack_from

        def read_scalar(mv: memoryview, pos: int) -> tuple[Any, int]:
            end = p.check_available(mv, pos, size, kind.name)
            return unpack_from(mv, pos)[0], end

        return read_scalar
    if kind is STRING:
        if flexible:
            return lambda mv, pos: p.read_compact_string(mv, pos, nullable)
        return p.read_nullable_string if nullable else p.read_string
    if kind is BYTES or kind is RECORDS:
        copy = kind is BYTES
        raw = p.read_compact_bytes if flexible else p.read_bytes

        def read_bytes(mv: memoryview, pos: int) -> tuple[Any, int]:
            view, end = raw(mv, pos, nullable)
            return (bytes(view) if copy and view is not None else view), end

        return read_bytes
    if isinstance(kind, Array):
        return _array_reader(kind, nullable, version, flexible)
    raise AssertionError(f"no reader for kind {kind!r}")


def _array_reader(kind: Array, nullable: bool, version: int, flexible: bool) -> Reader:
    element = kind.element
    read_length = p.read_compact_array_length if flexible else p.read_array_length
    if isinstance(element, Kind):
        min_bytes = _min_bytes(element, flexible)
        if element.fmt is not None:
            fmt = element.fmt

            def read_scalars(mv: memoryview, pos: int) -> tuple[Any, int]:
                n, pos = read_length(mv, pos, min_bytes, nullable)
                if n < 0:
                    return None, pos
                return list(struct.unpack_from(f">{n}{fmt}", mv, pos)), pos + n * min_bytes

            return read_scalars
        read_one = _reader(element, False, version, flexible)
    else:
        min_bytes = max(1, min_struct_bytes(element, version, flexible))
        fixed = _fixed_layout(element, version, flexible)
        if fixed is not None:
            layout, maker = fixed
            size = layout.size
            iter_unpack = layout.iter_unpack

            def read_fixed_structs(mv: memoryview, pos: int) -> tuple[Any, int]:
                n, pos = read_length(mv, pos, size, nullable)
                if n < 0:
                    return None, pos
                end = pos + n * size
                return [maker(*t) for t in iter_unpack(mv[pos:end])], end

            return read_fixed_structs
        read_one = decoder_for(element, version, flexible)

    def read_items(mv: memoryview, pos: int) -> tuple[Any, int]:
        n, pos = read_length(mv, pos, min_bytes, nullable)
        if n < 0:
            return None, pos
        items: list[Any] = []
        append = items.append
        for _ in range(n):
            item, pos = read_one(mv, pos)
            append(item)
        return items, pos

    return read_items


# -- encoders --------------------------------------------------------------------------------------------


def encoder_for(cls: type[Struct], version: int, flexible: bool) -> Callable[[Writer, Any], None]:
    """The compiled encoder of ``cls`` at ``version``: ``encode(writer, obj)``."""
    key = (cls, version, flexible)
    enc = _ENCODERS.get(key)
    if enc is None:
        enc = _compile_encoder(cls, version, flexible)
        _ENCODERS[key] = enc
    return enc


def _compile_encoder(cls: type[Struct], version: int, flexible: bool) -> Callable[[Writer, Any], None]:
    steps: list[tuple[str, FieldWriter | None, Callable[[Any], Any]]] = []
    run: list[FieldSpec] = []
    tagged: list[tuple[FieldSpec, FieldWriter]] = []

    def flush() -> None:
        if run:
            steps.append(_fixed_run_writer(list(run)))
            run.clear()

    for spec in field_specs(cls):
        if not spec.present(version) or (spec.tag is not None and not flexible):
            continue
        if spec.tag is not None:
            tagged.append((spec, _writer(spec, version, flexible)))
            continue
        if spec.kind.fmt is not None:
            run.append(spec)
            continue
        flush()
        steps.append((spec.name, _writer(spec, version, flexible), attrgetter(spec.name)))
    flush()
    steps_t = tuple(steps)
    tagged.sort(key=lambda t: t[0].tag or 0)

    def encode(w: Writer, obj: Any) -> None:
        if not isinstance(obj, cls):
            raise ValueError(f"expected a {cls.__name__}, got {type(obj).__name__}")
        field = ""
        try:
            for field, write, get in steps_t:  # noqa: B007 -- ``field`` names the failing field below
                if write is None:
                    w.buf += get(obj)
                else:
                    write(w, get(obj))
            if flexible:
                field = "tagged fields"
                _write_tagged(w, obj, tagged)
        except (struct.error, TypeError, AttributeError, OverflowError, ValueError, UnicodeError) as e:
            raise ValueError(f"{cls.__name__}.{field} (v{version}): {e}") from None

    return encode


def _fixed_run_writer(run: list[FieldSpec]) -> tuple[str, None, Callable[[Any], Any]]:
    layout = struct.Struct(">" + "".join(s.kind.fmt or "" for s in run))
    names = [s.name for s in run]
    pack = layout.pack
    if len(names) == 1:
        get_one = attrgetter(names[0])
        return names[0], None, lambda obj: pack(get_one(obj))
    get_all = attrgetter(*names)
    return ",".join(names), None, lambda obj: pack(*get_all(obj))


def _write_tagged(w: Writer, obj: Any, tagged: list[tuple[FieldSpec, FieldWriter]]) -> None:
    fields: dict[int, bytes] = {}
    for spec, write in tagged:
        value = getattr(obj, spec.name)
        if value == spec.make_default():
            continue
        sub = Writer()
        write(sub, value)
        fields[spec.tag or 0] = bytes(sub.buf)
    p.write_tagged_fields(w.buf, fields)


def _writer(spec: FieldSpec, version: int, flexible: bool) -> FieldWriter:
    return _kind_writer(spec.kind, spec.nullable(version), version, flexible)


def _kind_writer(kind: Kind, nullable: bool, version: int, flexible: bool) -> FieldWriter:
    fmt = kind.fmt
    if fmt is not None:
        pack = struct.Struct(">" + fmt).pack

        def write_scalar(w: Writer, value: Any) -> None:
            w.buf += pack(value)

        return write_scalar
    if kind is STRING:
        write_str = p.write_compact_string if flexible else p.write_string

        def write_string(w: Writer, value: Any) -> None:
            if value is None and not nullable:
                raise ValueError("null string where null is not allowed")
            if value is not None and not isinstance(value, str):
                raise TypeError(f"expected str, got {type(value).__name__}")
            write_str(w.buf, value)

        return write_string
    if kind is BYTES or kind is RECORDS:
        return _bytes_writer(kind is RECORDS, nullable, flexible)
    if isinstance(kind, Array):
        return _array_writer(kind, nullable, version, flexible)
    raise AssertionError(f"no writer for kind {kind!r}")


def _bytes_writer(records: bool, nullable: bool, flexible: bool) -> FieldWriter:
    def write_bytes(w: Writer, value: Any) -> None:
        if value is None:
            if not nullable:
                raise ValueError("null bytes where null is not allowed")
            if flexible:
                w.buf.append(0)
            else:
                w.buf += p.INT32.pack(-1)
            return
        if isinstance(value, FileRegion):
            if not records:
                raise TypeError("a FileRegion is only allowed in a records field")
            if value.size < 0 or value.position < 0:
                raise ValueError(f"negative FileRegion {value}")
            if flexible:
                p.write_uvarint(w.buf, value.size + 1)
            else:
                w.buf += p.INT32.pack(value.size)
            if value.size:
                w.add_part(value)
            return
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"expected bytes, got {type(value).__name__}")
        n = value.nbytes if isinstance(value, memoryview) else len(value)
        if flexible:
            p.write_uvarint(w.buf, n + 1)
        else:
            w.buf += p.INT32.pack(n)
        if records and n >= LARGE_BYTES_PART and isinstance(value, bytes):
            w.add_part(value)
        else:
            w.buf += value

    return write_bytes


def _array_writer(kind: Array, nullable: bool, version: int, flexible: bool) -> FieldWriter:
    element = kind.element
    write_length = p.write_compact_array_length if flexible else p.write_array_length
    write_one: FieldWriter
    if isinstance(element, Kind):
        if element.fmt is not None:
            fmt = element.fmt

            def write_scalars(w: Writer, value: Any) -> None:
                if value is None:
                    _write_null_array(w, nullable, flexible)
                    return
                write_length(w.buf, len(value))
                w.buf += struct.pack(f">{len(value)}{fmt}", *value)

            return write_scalars
        write_one = _kind_writer(element, False, version, flexible)
    else:
        write_one = encoder_for(element, version, flexible)

    def write_items(w: Writer, value: Any) -> None:
        if value is None:
            _write_null_array(w, nullable, flexible)
            return
        write_length(w.buf, len(value))
        for item in value:
            write_one(w, item)

    return write_items


def _write_null_array(w: Writer, nullable: bool, flexible: bool) -> None:
    if not nullable:
        raise ValueError("null array where null is not allowed")
    if flexible:
        w.buf.append(0)
    else:
        w.buf += p.INT32.pack(-1)
