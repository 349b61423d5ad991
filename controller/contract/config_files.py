"""Configuration files as every dualloop command reads them (TOML or YAML), and validation errors
reported one line per problem, naming the flag, the DUALLOOP_* variable or the file's field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dualloop.controller.contract.errors import ConfigError

ENV_PREFIX = "DUALLOOP_"
ENV_NESTED_DELIMITER = "__"
# the command-line flag of an override whose name differs from --<field-with-dashes>
_FLAG_OF = {
    "gates": "--gate",
    "candidate_gates": "--candidate-gate",
    "drain_grace_s": "--drain-grace",
    "allow_insecure_non_loopback": "--insecure-plaintext-on-network",
}


def env_name(loc: tuple[str | int, ...]) -> str:
    """The environment variable of a field path: ("executor", "max_observation_age_ms") ->
    DUALLOOP_EXECUTOR__MAX_OBSERVATION_AGE_MS (a list is one variable, given as JSON)."""
    names = [str(p) for p in loc if isinstance(p, str)]
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(names).upper()


def _has(data: dict[str, Any], loc: tuple[str | int, ...]) -> bool:
    """Whether the leading keys of loc are set in data (the source a validation error came from)."""
    if not loc or not isinstance(loc[0], str) or loc[0] not in data:
        return False
    value = data[loc[0]]
    return not isinstance(value, dict) or len(loc) == 1 or _has(value, loc[1:])


def problem_text(error: Any) -> str:
    """A pydantic error's message as a person reads it: our validators' own words without pydantic's
    "Value error, " prefix, and a rule on the whole configuration (no field) without "(top level)"."""
    cause = error.get("ctx", {}).get("error") if error["type"] == "value_error" else None
    message = str(cause) if cause is not None else str(error["msg"])
    field = ".".join(str(p) for p in error["loc"])
    return f"{field}: {message}" if field else message


def format_validation_error(
    err: ValidationError,
    source: str,
    env: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
) -> str:
    """One line per problem, naming where the value came from: the flag, the variable or the file's field."""
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc)
        if not loc:  # a rule across settings: its message names them
            lines.append(f"  {problem_text(e)}")
            continue
        if flags and loc[0] in flags:
            where = f"{_FLAG_OF.get(str(loc[0]), '--' + str(loc[0]).replace('_', '-'))} ({field})"
        elif env and _has(env, loc):
            where = f"{env_name(loc)} ({field})"
        elif e["type"] == "missing":
            where = f"{field} (in the config file, or {env_name(loc)}, or a flag)"
        else:
            where = field
        lines.append(f"  {where}: {problem_text({**e, 'loc': ()})}")
    return "\n".join(lines)


def read_text_file(path: Path, role: str) -> str:
    """The text of a file a person wrote (a configuration, a card), as UTF-8 (what TOML requires and
    YAML defaults to). A missing, unreadable or undecodable file is a ConfigError naming the file, its
    role and, for a bad byte, where it is: a UnicodeDecodeError's traceback named none of them."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {role} not found") from None
    except OSError as err:  # a folder, no permission: the reason without the [Errno N] prefix
        raise ConfigError(f"{path}: cannot read the {role}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - data.rfind(b"\n", 0, err.start)  # 1-based, in bytes
        raise ConfigError(
            f"{path}: the {role} is not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} "
            f"(line {line}, column {column}); save it as UTF-8"
        ) from None


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: configuration file not found")
    text = read_text_file(path, "configuration file")
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"{path}: unknown configuration format; use .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot parse: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/mapping of settings")
    return data
