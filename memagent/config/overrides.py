"""Building a TrainConfig: preset, then `--config FILE` (YAML or JSON), then `--section.field VALUE` flags.

The flags are generated from the dataclass fields (`--loss.clip-high 0.28`, `--rollout.group-size=4`), with the
field docstrings as help. Unknown sections or keys, in a file or on the command line, are errors naming the key.
Shortcuts: `--output-dir`, `--deepspeed`, `--resume [PATH]` set the `run.` fields of the same name (HF convention).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import typing
from pathlib import Path
from typing import Any

from memagent.config.presets import PRESETS
from memagent.config.schema import TrainConfig

Overrides = dict[str, dict[str, Any]]


def field_docs(cls: type) -> dict[str, str]:
    """The one-line docstring under each field of a dataclass (read from its source)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for prev, node in zip(body, body[1:]):
        if isinstance(prev, ast.AnnAssign) and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docs[prev.target.id] = str(node.value.value)  # type: ignore[union-attr]
    return docs


def sections() -> dict[str, type]:
    """Section name -> its dataclass type, in TrainConfig order."""
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


def parse_value(text: str, kind: Any, key: str) -> Any:
    """Turn a string into a value of the field's type (bool: true/false, None: none, tuples: a,b); `key` names it in errors."""
    args = typing.get_args(kind)
    if type(None) in args:
        if text.lower() in ("none", "null", ""):
            return None
        kind = next(a for a in args if a is not type(None))
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{key}: expected true or false, got {text!r}")
        return text.lower() in ("true", "1", "yes")
    if typing.get_origin(kind) is tuple:
        return tuple(parse_value(t, typing.get_args(kind)[0], key) for t in text.split(",") if t)
    try:
        return kind(text)
    except ValueError as err:
        raise ValueError(f"{key}: expected {kind.__name__}, got {text!r}") from err


def merge(base: Overrides, extra: dict[str, Any], origin: str) -> Overrides:
    """base updated by extra, refusing sections and keys that TrainConfig does not have."""
    out = {name: dict(values) for name, values in base.items()}
    known = sections()
    for name, values in extra.items():
        if name not in known:
            raise ValueError(f"{origin}: unknown section {name!r}; expected one of {sorted(known)}")
        if not isinstance(values, dict):
            raise ValueError(f"{origin}: section {name!r} must be a mapping of field: value")
        fields = {f.name for f in dataclasses.fields(known[name])}
        for key, value in values.items():
            if key not in fields:
                raise ValueError(f"{origin}: unknown key {name}.{key}; {name} has {sorted(fields)}")
            out.setdefault(name, {})[key] = tuple(value) if isinstance(value, list) else value
    return out


def read_config_file(path: str) -> dict[str, Any]:
    """A YAML (.yaml/.yml) or JSON file holding {section: {field: value}}, optionally with a top-level preset."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    if file.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as err:  # its message carries the line and column
            raise ValueError(f"--config {path}: not valid YAML: {err}") from err
    else:
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"--config {path}: line {err.lineno} column {err.colno}: {err.msg}") from err
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of sections at the top level")
    return data


def build_parser() -> argparse.ArgumentParser:
    """One flag per dataclass field, `--section.field-name`, plus --preset, --config and the run shortcuts."""
    parser = argparse.ArgumentParser(description="Train MemAgent with Multi-Conv DAPO.", allow_abbrev=False)
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="base settings (default: tiny without --model.path, else none: the generic defaults)")
    parser.add_argument("--config", default=None, help="YAML or JSON file of {section: {field: value}} overrides")
    parser.add_argument("--output-dir", dest="shortcut_output_dir", default=None, help="= --run.output-dir")
    parser.add_argument("--deepspeed", dest="shortcut_deepspeed", default=None, help="= --run.deepspeed")
    parser.add_argument("--resume", dest="shortcut_resume", nargs="?", const="latest", default=None,
                        help="= --run.resume; without a value: the latest checkpoint in the output dir")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    for name, cls in sections().items():
        group = parser.add_argument_group(name, cls.__doc__)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            # argparse %-formats help strings; a literal "10%" in a field's doc must not break --help.
            flag = f"--{name.replace('_', '-')}.{f.name.replace('_', '-')}"
            group.add_argument(flag, f"--{name}.{f.name}", dest=f"{name}.{f.name}", default=None, metavar="V",
                               help=f"{docs.get(f.name, '')} (default {f.default!r})".replace("%", "%%"))
    return parser


def load_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse the command line into a validated TrainConfig (preset < --config file < flags)."""
    args = build_parser().parse_args(argv)
    file_data = read_config_file(args.config) if args.config else {}
    preset = args.preset or file_data.pop("preset", None) or default_preset(args, file_data)
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is unknown; expected one of {sorted(PRESETS)}")
    overrides = merge({}, PRESETS[preset], f"preset {preset}") if preset else {}
    overrides = merge(overrides, file_data, f"--config {args.config}")
    hints = {name: typing.get_type_hints(cls) for name, cls in sections().items()}
    for name, values in file_data.items():  # type-check the file's values here, where the error can name the file
        for key in values:
            coerce(overrides[name][key], hints[name][key], f"--config {args.config}: {name}.{key}")
    flags: dict[str, dict[str, Any]] = {}
    for dest, text in vars(args).items():
        if "." in dest and text is not None:
            name, key = dest.split(".")
            flags.setdefault(name, {})[key] = parse_value(text, hints[name][key], "--" + dest.replace("_", "-"))
    for key in ("output_dir", "deepspeed", "resume"):
        if getattr(args, f"shortcut_{key}") is not None:
            flags.setdefault("run", {})[key] = getattr(args, f"shortcut_{key}")
    overrides = merge(overrides, flags, "command line")
    return make_config(overrides)


def default_preset(args: argparse.Namespace, file_data: dict[str, Any]) -> str | None:
    """`tiny` (the embedded demo) when no model path is given anywhere, else none: the generic defaults, so a
    user's model never gets the demo's warm start or learning rate by accident."""
    given = getattr(args, "model.path") is not None or "path" in file_data.get("model", {})
    return None if given else "tiny"


def make_config(overrides: Overrides) -> TrainConfig:
    """A TrainConfig from {section: {field: value}} on top of the defaults (validated, types coerced)."""
    overrides = merge({}, overrides, "overrides")
    built = {}
    for name, cls in sections().items():
        hints = typing.get_type_hints(cls)
        values = {k: coerce(v, hints[k], f"{name}.{k}") for k, v in overrides.get(name, {}).items()}
        built[name] = cls(**values)
    return TrainConfig(**built)


def coerce(value: Any, kind: Any, key: str) -> Any:
    """File values: ints where floats are expected become floats; strings are parsed like flags; types checked."""
    if isinstance(value, str) and kind is not str:
        return parse_value(value, kind, key)
    args = typing.get_args(kind)
    if value is None and type(None) in args:
        return None
    base = next((a for a in args if a is not type(None)), kind) if args and typing.get_origin(kind) is not tuple else kind
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    origin = typing.get_origin(base) or base
    if not isinstance(value, origin) or (origin is int and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {getattr(base, '__name__', base)}, got {value!r}")
    return value


def preset_config(name: str, **sections_overrides: dict[str, Any]) -> TrainConfig:
    """A preset plus Python-side overrides, e.g. preset_config("smoke", run={"steps": 1}) (for tests and notebooks)."""
    return make_config(merge(merge({}, PRESETS[name], f"preset {name}"), sections_overrides, "overrides"))
