"""One way to declare and parse settings, with Kafka's names, types and ranges, for every family of them.

Theory of operation
-------------------
Four families of settings use this kit: the server's configuration (a TOML file and ``--override``), the
producer and the consumer (a dict of Kafka's dotted names or keyword arguments) and the Spark data source's
options (strings with lower-cased keys).  Each declares its settings once, as a :class:`SettingTable` of
:class:`Setting` rows: the Kafka name, the default as a user would write it, a converter that checks the
type and range and returns the value to use, a one-line doc, and other names (:class:`Alias`, some scaled:
``log.retention.hours`` is ``retention.ms`` times 3600000).

**Converters** take one value and return the checked value, or raise :class:`Invalid` saying what was
expected.  They are built by the functions below (:func:`integer`, :func:`boolean`, :func:`choice`,
:func:`text`, ...) or written by a family for its own types.  ``text=True`` makes a number or a switch
accept its text too (``"5"``, ``"true"``), as Kafka's clients read their properties; without it the value
must have its type already, as the server's TOML file gives it, and a quoted number is refused with the
hint to write it without quotes.  Text read as a number reports ``expected a whole number ...``; a typed
number out of range reports ``must be between A and B``.

**Parsing** has one step per key (:func:`read_settings` runs it over a family's given pairs):

1. :meth:`SettingTable.find` resolves the key to its setting, by canonical name or alias (case-blind for
   a table built with ``case_blind=True``).  An unknown key is the family's :class:`ConfigError`, built
   with :meth:`SettingTable.nearest`, the closest known name, if any is close.
2. :func:`convert` scales an alias's value and runs the converter.  A bad value is **one error** for every
   family: :class:`ConfigError` with ``WHERE KEY=VALUE: REASON`` (:func:`bad_value`), the value quoted as
   the user wrote it (``key = "v"`` in TOML, ``key='v'`` in Python), e.g.
   ``/etc/appliance.toml: segment.bytes = 13: must be between 14 and 2147483647`` or
   ``producer setting linger.ms=-1: must be between 0 and 9223372036854775807``.

Defaults go through the same converters (:meth:`SettingTable.defaults`), so a default is written the way a
user would write the setting.  Cross-setting rules (idempotence needs ``acks=all``, a listener named twice)
stay with the family that has them.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from storage.errors import ConfigError

__all__ = [
    "INT_MAX",
    "LONG_MAX",
    "Alias",
    "Convert",
    "Found",
    "Invalid",
    "Origin",
    "Setting",
    "SettingTable",
    "bad_value",
    "boolean",
    "choice",
    "client_pairs",
    "convert",
    "did_you_mean",
    "file_path",
    "integer",
    "optional",
    "read_settings",
    "string_list",
    "text",
    "toml_str",
    "toml_value",
    "type_name",
]

LONG_MAX: Final = 2**63 - 1
INT_MAX: Final = 2**31 - 1

Convert = Callable[[object], object]


class Invalid(ValueError):
    """A value failed its converter; the message says what was expected (the key is added by the caller)."""


# -------------------------------------------------------------------------------------- declaring


class Alias(NamedTuple):
    """Another name of a setting; an integer given under it is multiplied by ``factor`` (-1 stays -1)."""

    name: str
    factor: int = 1


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its Kafka name, its default as a user writes it, its converter, what it does."""

    name: str
    default: object
    convert: Convert
    doc: str
    aliases: tuple[Alias, ...] = ()
    attr: str = ""  # the field of the family's resolved object it fills, where the family has one


class Found(NamedTuple):
    """What a key names: the setting and the factor of the alias used (1 for the canonical name)."""

    setting: Setting
    factor: int


class SettingTable:
    """A family's settings in declaration order, looked up by canonical name or alias.

    Iterating gives the :class:`Setting` rows.  A ``case_blind`` table matches keys in any case, as Spark
    hands a data source its options with lower-cased keys.
    """

    __slots__ = ("_by_key", "_case_blind", "_defaults", "_settings", "_spelling")

    def __init__(self, settings: Iterable[Setting], *, case_blind: bool = False) -> None:
        self._settings = tuple(settings)
        self._case_blind = case_blind
        self._by_key: dict[str, Found] = {}
        self._spelling: dict[str, str] = {}  # folded key -> the name as declared
        self._defaults: dict[str, object] | None = None  # converted on first use
        for setting in self._settings:
            for alias in (Alias(setting.name), *setting.aliases):
                key = self._fold(alias.name)
                assert key not in self._by_key, f"{alias.name} is declared twice"
                self._by_key[key] = Found(setting, alias.factor)
                self._spelling[key] = alias.name

    def __iter__(self) -> Iterator[Setting]:
        return iter(self._settings)

    def __len__(self) -> int:
        return len(self._settings)

    def _fold(self, key: str) -> str:
        return key.lower() if self._case_blind else key

    def find(self, key: str) -> Found | None:
        return self._by_key.get(self._fold(key))

    def nearest(self, key: str, extra: Iterable[str] = ()) -> str | None:
        """The known name closest to an unknown ``key`` (or one of ``extra``), if one is close enough."""
        close = difflib.get_close_matches(self._fold(key), [*self._by_key, *extra], n=1, cutoff=0.6)
        return self._spelling.get(close[0], close[0]) if close else None

    def defaults(self) -> dict[str, object]:
        """Every setting's default, converted, by canonical name (a new dict each call)."""
        if self._defaults is None:
            self._defaults = {setting.name: setting.convert(setting.default) for setting in self._settings}
        return dict(self._defaults)


# -------------------------------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class Origin:
    """Where values come from, as an error names them: the words before the key, and how values are quoted.

    ``label`` is ``"producer setting"``, ``"appliance data source: option"`` or ``"/etc/appliance.toml:"``;
    ``toml`` quotes a value as TOML writes it (``key = "v"``), otherwise as Python does (``key='v'``).
    """

    label: str
    toml: bool = False


def bad_value(origin: Origin, key: str, value: object, reason: str) -> ConfigError:
    """The one error for a bad value: ``WHERE KEY=VALUE: REASON``."""
    shown = f" = {_toml_shown(value)}" if origin.toml else f"={value!r}"
    return ConfigError(f"{origin.label} {key}{shown}: {reason}")


def convert(found: Found, key: str, value: object, origin: Origin) -> object:
    """``value`` given under ``key`` checked by the setting's converter; :func:`bad_value` if it fails."""
    setting, factor = found
    try:
        if factor == 1:
            return setting.convert(value)
        count = integer(-1, LONG_MAX // factor)(value)
        assert isinstance(count, int)
        return setting.convert(-1 if count == -1 else count * factor)
    except ValueError as exc:  # Invalid, or a converter's own ValueError
        raise bad_value(origin, key, value, str(exc)) from None


def did_you_mean(near: str | None) -> str:
    """`` (did you mean 'x'?)`` after a client's or Spark's unknown key, or nothing without a near name."""
    return f" (did you mean {near!r}?)" if near else ""


def client_pairs(config: Mapping[str, object] | None,
                 kwargs: Mapping[str, object]) -> list[tuple[str, object]]:
    """A Kafka client's settings as (dotted name, value): the dict, then keywords (``_`` for ``.``)."""
    return [*(config or {}).items(), *((key.replace("_", "."), value) for key, value in kwargs.items())]


def read_settings(table: SettingTable, pairs: Iterable[tuple[str, object]], origin: Origin,
                  unknown: Callable[[str], ConfigError]) -> dict[str, object]:
    """The given ``pairs`` checked and converted, by canonical name (a later pair wins).

    ``unknown(key)`` builds the family's error for a key the table does not know.
    """
    given: dict[str, object] = {}
    for key, value in pairs:
        found = table.find(key)
        if found is None:
            raise unknown(key)
        given[found.setting.name] = convert(found, found.setting.name, value, origin)
    return given


# -------------------------------------------------------------------------------------- converters


def type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", str: "a string", list: "an array", dict: "a table",
            type(None): "nothing"}.get(type(value), type(value).__name__)


_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def integer(minimum: int, maximum: int = LONG_MAX, *, text: bool = False) -> Convert:
    """An integer from ``minimum`` to ``maximum``; with ``text``, also its decimal text (``" 5"``)."""
    span = f">= {minimum}" if maximum == LONG_MAX else f"between {minimum} and {maximum}"

    def convert(value: object) -> object:
        if isinstance(value, str) and text:
            digits = value.strip()
            if not _WHOLE_NUMBER.fullmatch(digits) or not minimum <= int(digits) <= maximum:
                raise Invalid(f"expected a whole number {span}")
            return int(digits)
        if isinstance(value, bool) or not isinstance(value, int):
            quoted = isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value.strip()) is not None
            hint = "; write it without quotes" if quoted else ""
            raise Invalid(f"expected an integer, got {type_name(value)}{hint}")
        if not minimum <= value <= maximum:
            raise Invalid(f"must be between {minimum} and {maximum}")
        return value

    return convert


def boolean(*, text: bool = False) -> Convert:
    """``True`` or ``False``; with ``text``, also ``"true"`` or ``"false"`` in any case."""

    def convert(value: object) -> object:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and text:
            word = value.strip().lower()
            if word not in ("true", "false"):
                raise Invalid("expected true or false")
            return word == "true"
        raise Invalid(f"expected true or false, got {type_name(value)}")

    return convert


def text(value: object) -> str:
    """A string without NUL characters."""
    if not isinstance(value, str):
        raise Invalid(f"expected a string, got {type_name(value)}")
    if "\x00" in value:
        raise Invalid("contains a NUL character")
    return value


def file_path(value: object) -> str:
    """A path as a string or an ``os.PathLike``, kept as given (relative paths stay relative)."""
    return text(os.fspath(value) if isinstance(value, os.PathLike) else value)


def choice(options: Sequence[str]) -> Convert:
    """One of ``options``, matched in any case and returned as declared."""

    def convert(value: object) -> object:
        word = text(value)
        for option in options:
            if word.lower() == option.lower():
                return option
        raise Invalid(f"expected one of {', '.join(options)}")

    return convert


def string_list(value: object) -> list[str]:
    """An array of strings, or Kafka's comma-separated string (items stripped)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",")] if value.strip() else []
    if isinstance(value, list | tuple):
        return [text(item) for item in value]
    raise Invalid(f"expected an array of strings or a comma-separated string, got {type_name(value)}")


def optional(convert: Convert) -> Convert:
    """``None`` (unset), or what ``convert`` accepts."""

    def maybe(value: object) -> object:
        return None if value is None else convert(value)

    return maybe


# -------------------------------------------------------------------------------------- TOML text


def toml_str(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def toml_value(value: object) -> str:
    """A value as TOML writes it; ``TypeError`` for one TOML cannot hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _toml_shown(value: object) -> str:
    try:
        return toml_value(value)
    except TypeError:
        return repr(value)
