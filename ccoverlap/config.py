"""Reading configuration: files (JSON / TOML / YAML) into mappings, and mappings into
dataclasses with one clear error per problem.

The one place the project turns a user's mapping into a typed object: hardware
(:func:`ccoverlap.catalog.hardware.cluster_from_dict`), models (:func:`ccoverlap.catalog.models.model_from_dict`),
parallel / batch configurations and overlap knobs (:mod:`ccoverlap.parallel.config`,
:mod:`ccoverlap.predict.workload`) and overlap groups (:mod:`ccoverlap.deciders.overlap_group`) all go
through :func:`check_keys` / :func:`dataclass_from_mapping`, so an unknown field is reported the
same way everywhere: ``WHERE: unknown field(s) [...]; expected some of [...]``.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from ccoverlap.errors import ConfigError


def read_config_file(path: str | os.PathLike) -> dict:
    """Parse a JSON, TOML or YAML file into a dict; ConfigError names the file on any problem
    (missing file, unknown suffix, parse error with its first line, non-mapping top level)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such file")
    text = p.read_text(errors="replace")
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            data = toml_module().loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"{p}: unknown config format {suffix!r} (use .json, .toml, .yaml)")
    except ConfigError:
        raise
    except Exception as exc:  # the parsers' own errors: name file and position, no traceback
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{p}: not valid {suffix[1:].upper()}: {msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def toml_module():
    """The TOML parser: the standard library's ``tomllib`` (Python 3.11+), else ``tomli``
    (the same parser, installed as a dependency on Python 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ConfigError("reading TOML on Python 3.10 needs the 'tomli' package "
                              "(pip install tomli)") from None
    return tomllib


def read_json_object(path: str | os.PathLike, what: str = "file") -> dict:
    """A JSON file whose top level is an object, as a dict. ConfigError names the file: missing
    (``no such WHAT``), not JSON (line and column), or not an object. The one reader of
    calibration files (:meth:`ccoverlap.cost.CostParams.load`,
    :func:`ccoverlap.calibrate.fileformat.read`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such {what}")
    try:
        data = json.loads(p.read_text(errors="replace"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def check_keys(data: Any, allowed: Iterable[str], where: str, *, what: str = "field") -> dict:
    """``data`` itself if it is a mapping whose keys are all in ``allowed``; otherwise one
    ConfigError naming ``where`` and every unknown key (``what``: the word for a key)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = set(allowed)
    unknown = sorted(str(k) for k in set(data) - allowed)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise ConfigError(f"{where}: unknown {what}{'s' if len(unknown) > 1 else ''} {names}; "
                          f"expected some of {sorted(allowed)}")
    return dict(data)


def field_names(cls) -> set[str]:
    """The field names of dataclass ``cls``."""
    return {f.name for f in fields(cls)}


def dataclass_from_mapping(cls, data: Any, where: str, *, aliases: Mapping[str, str] | None = None,
                           base: Any = None):
    """``cls(**data)`` for a config-file mapping; ConfigError naming ``where`` on a non-mapping,
    unknown fields, missing fields or a value ``cls`` rejects.

    ``aliases`` maps other spellings to field names (e.g. Hugging Face ``config.json`` keys);
    ``base``: an instance whose values fill the fields ``data`` lacks (``dataclasses.replace``).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    if aliases:
        data = {aliases.get(k, k): v for k, v in data.items()}
    data = check_keys(data, field_names(cls), where)
    try:
        if base is not None:
            from dataclasses import replace

            return replace(base, **data)
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
