"""Reading a quantization config's JSON with every field's type checked: a file that cannot be read, or a field of
the wrong JSON type, is a ``ConfigError`` naming it (the string ``"false"`` is not read as true, ``[4]`` is not 4)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A quantization config that no checkpoint can have (names the field, the value, the rule)."""


def config_int(data: Mapping[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` present, as an int (a JSON integer; ``4.0`` is accepted, ``true`` and ``"4"`` are not)."""
    for key in keys:
        if key in data:
            value = data[key]
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{key}: expected an integer, found {value!r}")
            return value
    return None


def config_bool(data: Mapping[str, Any], key: str, default: bool) -> bool:
    """A JSON boolean (a string such as ``"false"`` would otherwise read as True)."""
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, found {value!r}")
    return value


def load_mapping(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    path = Path(source)
    if path.is_dir():
        for name in ("quantize_config.json", "quant_config.json", "config.json"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise ConfigError(f"{source}: no quantize_config.json, quant_config.json or config.json in this directory")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
