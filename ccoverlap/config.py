"""Reading configuration: files (JSON / TOML / YAML) into mappings, and mappings into typed,
bounded objects with one short, clear error per problem.

The one place the project turns a user's mapping into a typed object: hardware
(:func:`ccoverlap.catalog.hardware.cluster_from_dict`), models (:func:`ccoverlap.catalog.models.model_from_dict`),
parallel / batch configurations and overlap knobs (:mod:`ccoverlap.parallel.config`,
:mod:`ccoverlap.predict.workload`), runs files (:mod:`ccoverlap.validation.reader`) and overlap
groups (:mod:`ccoverlap.nccl.groups`) all go through :func:`check_keys` /
:func:`typed` / :func:`dataclass_from_mapping`:

* an unknown field is reported the same way everywhere, with the closest known name:
  ``WHERE: unknown field 'tpp' (did you mean 'tp'?); expected some of [...]``;
* values are converted by ``msgspec.convert`` in strict mode against the dataclass's type
  annotations: ``Literal`` choices, integer ranges (``Annotated[int, Meta(ge=1, le=...)]``),
  no bools or floats where counts go, no strings where numbers go;
* an error message quotes at most :data:`QUOTE_CHARS` characters of a bad value
  (:func:`short`), so a huge string or a deeply shared YAML structure gives one short line;
* a configuration file larger than :data:`MAX_CONFIG_BYTES` is refused before it is parsed;
* the same annotations bind an object built directly in Python: the configuration dataclasses
  (parallel, batch, knobs, model, hardware, op specs) call :func:`check_fields` in their
  ``__post_init__``, and the API's keyword limits go through :func:`check_value`, so a value
  gets the same answer and message however it arrives.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import os
import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from ccoverlap.errors import ConfigError

try:
    import msgspec
except ImportError:  # a machine without msgspec: the analyser runs; typed conversion says it needs it
    msgspec = None  # type: ignore[assignment]  # the checker sees the installed module; None only without it

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")

#: Largest configuration / runs file read (bytes); the shipped ones are a few KiB.
MAX_CONFIG_BYTES = 16 * 2**20
#: Most characters of a bad value an error message quotes.
QUOTE_CHARS = 40
#: Most characters of one error message built here.
MESSAGE_CHARS = 400
#: Most characters of a path an error message names (cut in the middle, :func:`clip_middle`).
PATH_CHARS = 160



def bounded(kind: type, **limits: Any) -> Any:
    """``Annotated[kind, msgspec.Meta(**limits)]``: a type whose values :func:`typed` checks
    against ``limits`` (``ge``, ``le``, ``gt``, ...); plain ``kind`` without msgspec."""
    return Annotated[kind, msgspec.Meta(**limits)] if msgspec is not None else kind


# Bounded integer types for configuration fields (msgspec constraints).
#: A parallel degree, a node count or a GPU count: 1 .. 2**20.
Count = bounded(int, ge=1, le=2**20)
#: A count that may be zero (prefetch depth, experts of a dense model): 0 .. 2**20.
Count0 = bounded(int, ge=0, le=2**20)
#: Sequences or tokens: 1 .. 2**30.
Size = bounded(int, ge=1, le=2**30)
#: Largest size (layers, hidden, vocabulary, ...) a model may have.
MAX_MODEL_SIZE = 2**31 - 1
#: A model's size: 1 .. MAX_MODEL_SIZE; or 0 .. for an optional one.
ModelSize = bounded(int, ge=1, le=MAX_MODEL_SIZE)
ModelSize0 = bounded(int, ge=0, le=MAX_MODEL_SIZE)
#: An op's dimension or count (GEMM m / n / k, kernels, group size): at least 1; or 0 and up.
Dim = bounded(int, ge=1)
Dim0 = bounded(int, ge=0)
#: Bytes per element of an operand: 1 .. 8.
ElementBytes = bounded(int, ge=1, le=8)
#: NCCL threads per block: at least one warp (32).
Threads = bounded(int, ge=32)
#: A physical quantity in base units (FLOP/s, bytes, bytes/s, seconds): more than 0 and finite
#: (at most 1e30, far above any real value; NaN and infinity are refused).
Positive = bounded(float, gt=0, le=1e30)
#: As :data:`Positive`, zero allowed.
NonNegative = bounded(float, ge=0, le=1e30)

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = QUOTE_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_REPR.maxlevel = 2


def short(value: Any) -> str:
    """``repr(value)`` cut to about :data:`QUOTE_CHARS` characters, and at most two levels and
    four items deep: safe for any value a file can hold (a 200 MB string, a YAML structure
    that shares itself a billion times)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # e.g. an integer past the 4300 digits str() writes
        text = f"<{type(value).__name__}>"
    return text if len(text) <= QUOTE_CHARS + 10 else text[:QUOTE_CHARS] + "..."


def clip_middle(text: str, n: int = PATH_CHARS) -> str:
    """``text`` cut in the middle to about ``n`` characters, saying how many were left out (a long
    path keeps its start and its file name)."""
    if len(text) <= n + 30:
        return text
    k = n // 2
    return f"{text[:k]}...[{len(text) - 2 * k} characters]...{text[-k:]}"


def few(items: Iterable[str], n: int = 3, sep: str = "; ") -> str:
    """The first ``n`` of ``items``, each cut to :data:`MESSAGE_CHARS` (:func:`clip_middle`), joined
    by ``sep``, and how many more there are: one message however many problems or files."""
    items = list(items)
    text = sep.join(clip_middle(str(x), MESSAGE_CHARS) for x in items[:n])
    return text + (f"{sep}and {len(items) - n} more" if len(items) > n else "")


def clip_line(text: str, limit: int = 500) -> str:
    """``text`` as one line (line breaks become spaces) of at most ``limit`` characters: a
    longer one keeps its start and end with ``" ... "`` between (an error line stays readable
    whatever value it quotes)."""
    text = " ".join(str(text).split("\n"))
    if len(text) <= limit:
        return text
    head = (limit - 5) * 2 // 3
    return text[:head] + " ... " + text[len(text) - (limit - 5 - head):]


def _clip(message: str) -> str:
    """``message`` with every quoted run longer than :data:`QUOTE_CHARS` cut, and the whole
    cut to :data:`MESSAGE_CHARS`."""
    message = re.sub(r"'([^'\n]{%d})[^'\n]*'" % QUOTE_CHARS, r"'\1...'", message)
    message = message.splitlines()[0] if message else message
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + "..."


def toml_module() -> ModuleType:
    """The TOML parser: the standard library's ``tomllib`` (Python 3.11+), else ``tomli``
    (the same parser, installed as a dependency on Python 3.10)."""
    for name in ("tomllib", "tomli"):  # imported by name: which one exists depends on the Python
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ConfigError("reading TOML on Python 3.10 needs the 'tomli' package (pip install tomli)")


def _path_name(p: Path) -> str:
    """``p`` as given, or a short quote of it when it is longer than 200 characters."""
    return str(p) if len(str(p)) <= 200 else short(str(p))


def _path(path: Any, what: str) -> Path:
    """``path`` (text or ``os.PathLike``) as a Path; ConfigError saying a ``what`` path is
    expected otherwise."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"expected the path of a {what}, got {short(path)}")
    return Path(path)


def _read_text(p: Path, what: str) -> str:
    try:
        size = p.stat().st_size if p.is_file() else None
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, no permission
        why = (exc.strerror if isinstance(exc, OSError) else None) or type(exc).__name__
        raise ConfigError(f"{_path_name(p)}: cannot read the {what}: {why}") from None
    if size is None:
        kind = ("a directory" if p.is_dir() else "not a regular file (a device, socket or pipe?)"
                if p.exists() else None)
        raise ConfigError(f"{_path_name(p)}: " + (f"{kind}, expected a {what}" if kind else f"no such {what}"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{_path_name(p)}: {size / 2**20:.0f} MiB is larger than a {what} may be "
                          f"({MAX_CONFIG_BYTES // 2**20} MiB)")
    try:
        return p.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(f"{_path_name(p)}: cannot read the {what}: {exc.strerror or type(exc).__name__}") from None


class DuplicateKey(ValueError):
    """A mapping of a config file gives the same key twice (the parsers would keep the last
    silently)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads``' ``object_pairs_hook``: the object as a dict; DuplicateKey on a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"key {short(key)} given twice in one object")
        out[key] = value
    return out


def _yaml_unique_loads(text: str) -> Any:
    """``yaml.safe_load`` (the C loader when there is one) that raises DuplicateKey on a key given
    twice in one mapping; keys a merge (``<<: *anchor``) brings in may still be overridden."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class UniqueKeyLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    twice = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base loader names it
                    continue
                if twice:
                    raise DuplicateKey(f"key {short(key)} given twice in one mapping "
                                       f"(line {key_node.start_mark.line + 1})")
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader)


def read_config_file(path: str | os.PathLike) -> dict:
    """Parse a JSON, TOML or YAML file into a dict; ConfigError names the file on any problem
    (missing or oversized file, unknown suffix, parse error with its first line, non-mapping
    top level)."""
    p = _path(path, "config file")
    suffix = p.suffix.lower()
    if suffix not in (".json", ".toml", ".yaml", ".yml"):
        raise ConfigError(f"{_path_name(p)}: unknown config format {short(suffix)} (use .json, .toml, .yaml)")
    text = _read_text(p, "file")
    try:
        if suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        elif suffix == ".toml":
            data = toml_module().loads(text)  # TOML itself forbids a key given twice
        else:
            data = _yaml_unique_loads(text)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{_path_name(p)}: not valid {suffix[1:].upper()}: nested too deeply") from None
    except Exception as exc:  # the parsers' own errors: name file and position, no traceback
        raise ConfigError(f"{_path_name(p)}: not valid {suffix[1:].upper()}: {_clip(str(exc)) or type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{_path_name(p)}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_json_object(path: str | os.PathLike, what: str = "file") -> dict:
    """A JSON file whose top level is an object, as a dict. ConfigError names the file: missing
    (``no such WHAT``), not JSON (line and column), or not an object. The one reader of
    calibration files (:meth:`ccoverlap.cost.CostParams.load`,
    :func:`ccoverlap.calibrate.fileformat.read`)."""
    p = _path(path, what)
    text = _read_text(p, what)
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{_path_name(p)}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except DuplicateKey as exc:
        raise ConfigError(f"{_path_name(p)}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{_path_name(p)}: not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{_path_name(p)}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def suggest(name: Any, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``name`` (difflib), or ``""``."""
    if not isinstance(name, str) or len(name) > 100:
        return ""
    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.7)
    if not close:
        close = difflib.get_close_matches(name.lower(), [str(c).lower() for c in choices], n=1, cutoff=0.7)
        close = [c for c in choices if str(c).lower() == close[0]] if close else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(data: Any, allowed: Iterable[str], where: str, *, what: str = "field") -> dict:
    """``data`` itself if it is a mapping whose keys are all in ``allowed``; otherwise one
    ConfigError naming ``where``, the unknown key(s) and the closest known name."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = set(allowed)
    unknown = sorted((k for k in data if k not in allowed), key=str)
    if unknown:
        names = ", ".join(short(k) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise ConfigError(f"{where}: unknown {what}{'s' if len(unknown) > 1 else ''} {names}"
                          f"{suggest(unknown[0], allowed)}; expected some of {sorted(allowed)}")
    return dict(data)


def field_names(cls: type) -> set[str]:
    """The field names of dataclass ``cls``."""
    return {f.name for f in fields(cls)}


def _literal_choices(cls: type, name: str) -> tuple[Any, ...] | None:
    """The choices of field ``name`` of ``cls`` when it is a ``Literal`` (possibly optional)."""
    try:
        hint = get_type_hints(cls, include_extras=True).get(name)
    except Exception:
        return None
    for t in (hint, *get_args(hint)):
        if get_origin(t) is Literal:
            return get_args(t)
    return None


_WORDS = {"int": "an integer", "bool": "true or false", "float": "a number", "str": "text", "array": "a list",
          "object": "a mapping", "null": "empty"}


def _words(types: str) -> str:
    return " or ".join(_WORDS.get(t.strip(), t.strip()) for t in types.split("|") if t.strip() != "null")


def _value_at(data: Any, path: str) -> tuple[bool, Any]:
    """(found, value) of ``data`` at a msgspec path such as ``.parallel.tp`` or ``.runs[3]``."""
    for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        try:
            data = data[key] if key else data[int(index)]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, data


def validation_message(exc: Exception, target: Any, data: Any) -> str:
    """One short line for a msgspec validation error, naming the field and quoting at most a
    short prefix of the value: ``tp must be an integer, got 'two'``."""
    text = str(exc)
    m = re.match(r"^(.*?) - at `\$(.*)`$", text, re.S)
    if not m and text.startswith("Object missing required field"):
        m = re.match(r"^(.*)()$", text, re.S)
    if not m:  # raised by the object's own checks (__post_init__): already a sentence
        return _clip(text)
    what, path = m.group(1).replace("`", ""), m.group(2)
    fld = path.lstrip(".") or "value"
    found, value = _value_at(data, path)
    got = f", got {short(value)}" if found else ""
    if what.startswith("Invalid enum value"):
        top = re.match(r"[A-Za-z_]\w*", fld)
        choices = _literal_choices(target, top.group(0)) if top and isinstance(target, type) else None
        out = f"{fld} must be one of {list(choices)}{got}" if choices else f"{fld} is not one of the allowed values{got}"
    elif what.startswith("Object missing required field"):
        out = f"missing field {what.removeprefix('Object missing required field').strip()!r}"
        out += f" in {fld}" if path else ""
    elif (t := re.match(r"Expected (.+?), got (\w+)$", what)):
        out = f"{fld} must be {_words(t.group(1))}, got {short(value) if found else t.group(2)}"
    elif (t := re.match(r"Expected (\w+) (.*)$", what)):  # a range: 'Expected int >= 1'
        out = f"{fld} must be {_words(t.group(1))} {t.group(2)}{got}"
    else:
        out = f"{fld}: {what[0].lower() + what[1:]}"
    return _clip(out)


def typed(data: Any, target: Any, where: str) -> Any:
    """``data`` converted to ``target`` (a dataclass, msgspec Struct or type) by
    ``msgspec.convert`` in strict mode; one short ConfigError naming ``where`` and the field
    otherwise (wrong type, out of range, not one of the choices, or the object's own check)."""
    if msgspec is None:
        raise ConfigError(f"{where}: reading configuration needs the 'msgspec' package (pip install msgspec)")
    try:
        return msgspec.convert(data, target, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {validation_message(exc, target, data)}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None


@functools.cache
def _field_checker(cls: type) -> tuple[Any, tuple[tuple[str, type], ...]]:
    """What :func:`check_fields` needs for dataclass ``cls``: a msgspec Struct with its fields
    and annotations (a field holding a dataclass as ``Any``), and the (name, dataclass) of
    those fields, which must hold an instance (msgspec would build one from a mapping)."""
    hints = get_type_hints(cls, include_extras=True)
    nested = tuple((f.name, hints[f.name]) for f in fields(cls)
                   if isinstance(hints[f.name], type) and is_dataclass(hints[f.name]))
    plain = {name for name, _ in nested}
    struct = msgspec.defstruct(f"{cls.__name__}Fields",
                               [(f.name, Any if f.name in plain else hints[f.name]) for f in fields(cls)])
    return struct, nested


def check_fields(obj: Any, where: str | None = None) -> None:
    """ConfigError when a field of dataclass instance ``obj`` breaks its type annotation: the
    rules :func:`typed` applies to a config file's mapping (types, ``bounded`` ranges,
    ``Literal`` choices; no bool or float where an integer goes, no NaN where a bounded number
    goes), applied to an object built directly in Python, with the same message
    (``tp must be an integer <= 1048576, got 1099511627776``). Called by the configuration
    dataclasses' ``__post_init__``; a field annotated with a dataclass must hold an instance of
    it (which checked itself when it was built)."""
    if msgspec is None:
        return
    kind: type = type(obj)
    checker, nested = _field_checker(kind)
    prefix = f"{where}: " if where else ""
    for name, cls in nested:
        if not isinstance(getattr(obj, name), cls):
            raise ConfigError(f"{prefix}{name} must be a {cls.__name__}, got {short(getattr(obj, name))}")
    try:
        msgspec.convert(obj, checker, from_attributes=True, strict=True)
        return
    except msgspec.ValidationError as exc:
        error = exc
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    plain = {k: _python_scalar(v) for k, v in values.items()}
    if any(plain[k] is not v for k, v in values.items()):  # NumPy scalars are checked as the numbers they hold
        try:
            msgspec.convert(plain, checker, strict=True)
            return
        except msgspec.ValidationError as exc:
            error = exc
    raise ConfigError(prefix + validation_message(error, type(obj), values)) from None


def _python_scalar(value: Any) -> Any:
    """A NumPy scalar (``numpy.int64(8)``, ``numpy.float64(0.5)``) as the Python number it
    holds; anything else as it is."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def plain_numbers(value: Any) -> Any:
    """``value`` with every NumPy scalar in it (``numpy.int64(2)``, ``numpy.float32(0.5)``,
    ``numpy.bool_(True)``), also inside mappings, lists and tuples, replaced by the Python
    number or bool it holds, so the API takes NumPy numbers wherever it takes numbers (a NumPy
    bool is still refused where a count goes: it becomes a Python bool)."""
    if isinstance(value, Mapping):
        return {k: plain_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_numbers(v) for v in value) if type(value) in (list, tuple) else value
    return _python_scalar(value)


@functools.cache
def _value_checker(name: str, kind: Any) -> Any:
    return msgspec.defstruct("Value", [(name, kind)])


def check_value(name: str, value: Any, kind: Any) -> Any:
    """``value`` (a NumPy scalar as the Python number it holds) when it is a ``kind`` (a type,
    ``bounded`` type or ``Literal``, as a config file's field is checked by :func:`typed`); else ConfigError with the file's message for a
    field ``name``: ``jobs must be an integer >= 1, got 0``. For the keyword arguments of the
    Python API (process counts, limits), checked where they enter."""
    if msgspec is None:
        return value
    checker = _value_checker(name, kind)
    value = _python_scalar(value)
    try:
        msgspec.convert({name: value}, checker, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(validation_message(exc, checker, {name: value})) from None
    return value


def dataclass_from_mapping(cls: type[_D], data: Any, where: str, *, aliases: Mapping[str, str] | None = None,
                           base: _D | None = None) -> _D:
    """``cls`` from a config-file mapping, typed and bounded by :func:`typed`; ConfigError
    naming ``where`` on a non-mapping, unknown fields, missing fields or a value ``cls``
    rejects.

    ``aliases`` maps other spellings to field names (e.g. Hugging Face ``config.json`` keys);
    ``base``: an instance whose values fill the fields ``data`` lacks.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    if aliases:
        data = {aliases.get(k, k): v for k, v in data.items()}
    data = check_keys(data, field_names(cls), where)
    if base is not None:
        data = {**{f.name: getattr(base, f.name) for f in fields(cls)}, **data}
    return typed(data, cls, where)
