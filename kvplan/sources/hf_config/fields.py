"""Typed access to config.json fields: every error names the file and the field; reading the file itself."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.text import plain, shorten

MAX_LAYERS = 100_000  # far above any real model; refuses absurd configs before building per-layer lists


MAX_FIELD = 2**53  # no real size field comes near; above it float arithmetic would be inexact or overflow


_MISSING = object()


class Fields:
    """Typed access to a config dict; every error names the file and the field."""

    def __init__(self, data: dict, where: str):
        self.data = data
        self.where = where

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def get(self, *names: str, default: Any = _MISSING) -> Any:
        for name in names:
            if self.data.get(name) is not None:
                return self.data[name]
        if default is _MISSING:
            also = f" (also looked for {', '.join(names[1:])})" if len(names) > 1 else ""
            raise KvplanError(f"{self.where}: missing field {names[0]}{also}")
        return default

    def int(self, *names: str, default: Any = _MISSING, minimum: int = 1) -> Any:
        for name in names:
            value = self.data.get(name)
            if value is not None:
                break
        else:  # absent: the default, as given (a config's own value is always checked)
            return self.get(*names, default=default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise KvplanError(f"{self.where}: field {name} must be a whole number, got {value!r}")
        if value < minimum:
            raise KvplanError(f"{self.where}: field {name} must be at least {minimum}, got {value}")
        if value > MAX_FIELD:
            raise KvplanError(f"{self.where}: field {name} has {len(str(value))} digits, too large for a real model")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.data.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise KvplanError(f"{self.where}: field {name} must be true or false, got {value!r}")
        return value

    def layers(self, *names: str, default: Any = _MISSING) -> int:
        """A layer count, refused past MAX_LAYERS before anything is built per layer."""
        count = self.int(*names, default=default)
        if count > MAX_LAYERS:
            name = next(name for name in names if self.has(name))
            raise KvplanError(f"{self.where}: field {name} is {count:,}: more layers than any real model (at most "
                              f"{MAX_LAYERS:,} are read)")
        return count

    def number(self, name: str) -> float:
        """A positive factor (an MLP multiplier), at most MAX_FIELD as an int field is."""
        value = self.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_FIELD:
            raise KvplanError(f"{self.where}: field {name} must be a positive number up to {MAX_FIELD:,}, got "
                              f"{shorten(repr(value))}")
        return value

    def list(self, name: str, item: type = str, length: int | None = None) -> list:
        """A list field (empty if absent); `item` checks each entry, `length` the count (one per layer)."""
        value = self.data.get(name)
        if value is None:
            return []
        def fits(entry: Any) -> bool:  # bool is an int subclass: only a bool list takes bools
            return isinstance(entry, item) and (item is bool or not isinstance(entry, bool))

        if not isinstance(value, list) or not all(fits(v) for v in value):
            raise KvplanError(f"{self.where}: field {name} must be a list of {item.__name__} values")
        if length is not None and len(value) != length:
            raise KvplanError(f"{self.where}: field {name} must have one entry for each of the {length} layers")
        return value

    def per_layer(self, name: str, layers: int, readable: tuple[str, ...]) -> dict[int, dict]:
        """A per-layer override map, {layer index (a string, "05"): {field: value}}: the layers that differ from the
        global config (transformers `HeterogeneousConfigMixin`, `per_layer_config`). Each entry may override only
        the `readable` fields, which the caller reads per layer."""
        raw = self.mapping(name)
        overrides = {}
        for key in raw.data:
            if not str(key).isdigit() or int(key) >= layers:
                raise KvplanError(f"{self.where}: field {name} has an entry for layer {shorten(repr(key))}, but the "
                                  f"model's layers are 0 to {layers - 1}")
            entry = raw.mapping(key)
            unread = sorted(set(entry.data) - set(readable))
            if unread:
                raise KvplanError(f"{self.where}: field {name}[{key}] overrides {shorten(', '.join(unread))}, which "
                                  "kvplan does not read per layer")
            overrides[int(key)] = entry.data
        return overrides

    def mapping(self, name: str) -> Fields:
        """A nested object field as Fields (empty if absent), so errors name the path to it."""
        value = self.data.get(name)
        if value is not None and not isinstance(value, dict):
            raise KvplanError(f"{self.where}: field {name} must be an object, got {type(value).__name__}")
        return Fields(value or {}, f"{self.where} {name}")


MAX_TEXT_FILE = 16 * 2**20  # a config.json, YAML spec or model list: the largest real configs are under 1 MiB


def read_text(path: Path, limit: int = MAX_TEXT_FILE) -> str:
    """A small UTF-8 text file (a BOM is dropped). Only a regular file is read, so a FIFO or a device named by
    mistake cannot block or stream forever, and at most `limit` bytes of it."""
    shown = plain(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise KvplanError(f"{shown}: not a regular file (a directory, a pipe or a device)")
        with path.open("rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as err:
        raise KvplanError(f"{shown}: cannot read ({err.strerror or err})") from None
    if len(raw) > limit:
        raise KvplanError(f"{shown}: larger than {limit // 2**20} MiB, far past any real config: not read")
    if not raw.strip():
        raise KvplanError(f"{shown}: file is empty")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise KvplanError(f"{shown}: not a text file (it holds binary data, not UTF-8 JSON or YAML)") from None


def load_json(text: str | bytes, where: str) -> object:
    """JSON as Python reads it (which accepts the bare `Infinity` / `NaN` some configs carry), with one-line
    errors for malformed text, nesting deeper than Python recurses and numbers of thousands of digits."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise KvplanError(f"{plain(where)}: malformed JSON at line {err.lineno}, column {err.colno}: "
                          f"{err.msg}") from None
    except RecursionError:
        raise KvplanError(f"{plain(where)}: JSON nested too deeply to be a model's description") from None
    except ValueError as err:  # an integer past Python's digit limit
        raise KvplanError(f"{plain(where)}: JSON holds a value no model has ({shorten(str(err))})") from None


def parse_json(text: str, where: str) -> dict:
    """A config.json's text as a dict."""
    data = load_json(text, where)
    if not isinstance(data, dict):
        raise KvplanError(f"{plain(where)}: expected a JSON object with the model's fields, got "
                          f"{type(data).__name__}")
    return data
