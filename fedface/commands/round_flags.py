"""The round settings as command-line flags, generated from `RoundConfig`: `fedface admin round open` and
`fedface sim cross-device` add theirs from this one table, so each setting has one name, one default and
one help text.

Invariants:
- Every flag is a `RoundConfig` field (nested sections included): its type, choices and default are the
  field's, its help is the field's description. Only the name and the metavar are chosen here: the name is
  the section's prefix and the field's name (`_s` dropped, `_` as `-`) unless FLAG_NAMES says otherwise.
- A field is a flag unless NOT_FLAGS names it with the reason; a field of a type a command line cannot
  carry (a list) is never one. round_flags_test checks that every field is one or the other.
- A command adds the settings it honours with `add_round_flags`; neither adds one of these flags by hand
  (round_flags_test compares both parsers with the table).
- A flag records that it was given (`given_settings`), so that a preset (`round open --settings`) keeps
  what a flag did not set.
- A bool is `--flag [{on,off}]`: the bare flag means on, so the switches of before still parse.
- An old spelling is an `Alias`, hidden from help, kept for one release.
- Imports only the pydantic models (no torch): `fedface ... --help` stays light.
"""
from __future__ import annotations

import argparse
import copy
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from facecore.federation.config import RoundConfig

# The prefix of each section's flags ("" for RoundConfig's own fields).
PREFIXES = {"": "", "local": "local-", "spreadout": "spreadout-", "aggregation": "", "secure_aggregation": "secagg-"}
# Names the rule would not give: the spellings operators and the docs already use.
FLAG_NAMES = {
    "target_participants": "--target",
    "min_participants": "--min",
    "local.margin": "--margin",
    "local.trainable_blocks": "--trainable-blocks",
    "local.upload_bits": "--upload-bits",
    "local.download_bits": "--download-bits",
    "local.train_embedding": "--train-embedding",
    "aggregation.method": "--aggregation",
    "aggregation.dp_noise_multiplier": "--dp-noise",
    "secure_aggregation.enabled": "--secure-aggregation",
}
METAVARS = {
    "local.lr": "RATE", "local.margin": "COS", "local.trainable_blocks": "K", "local.upload_bits": "BITS", "local.download_bits": "BITS",
    "spreadout.nu": "COS", "spreadout.lr": "RATE", "spreadout.momentum": "BETA",
    "aggregation.trim_beta": "FRACTION", "aggregation.max_update_norm": "NORM", "aggregation.dp_noise_multiplier": "Z",
    "aggregation.dp_delta": "DELTA", "aggregation.server_momentum": "BETA",
    "secure_aggregation.threshold_fraction": "FRACTION", "secure_aggregation.scale_bits": "BITS",
    "secure_aggregation.max_update_norm": "NORM",
}
NOT_FLAGS = {
    "strategy": "the server's FedFace step or plain FedAvg: the simulator's --method, and round open opens FedFace rounds",
    "local.feature_center": "a vector: the current version's published centre (round open) or --center-features (the simulator)",
}
# Help for a field whose description is still missing (the description wins once it has one).
FALLBACK_HELP = {
    "aggregation.method": "backbone aggregation: fedavg, a robust one against malicious devices (median, trimmed_mean, "
                          "norm_bounded), or dp_fedavg (user-level DP)",
    "secure_aggregation.enabled": "mask each backbone update (Bonawitz et al.): the server sees only their sum; fedavg only",
}
GIVEN = "round_flags_given"  # the namespace attribute: the dests of the round flags given on the command line


def on_off(value: str) -> bool:
    """An {on,off} option's value. Its default is written as the word too: argparse passes a string default
    through `type`, so the parsed value is still a bool while the help shows `(default: on)`."""
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError("use on or off")
    return value == "on"


class _Setting(argparse.Action):
    """Stores the value, and notes that the setting was given (a preset keeps the ones that were not)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        setattr(namespace, GIVEN, frozenset(getattr(namespace, GIVEN, frozenset())) | {self.dest})


@dataclass(frozen=True)
class RoundFlag:
    path: str  # the RoundConfig field, dotted: "local.lr"
    flag: str
    default: Any  # RoundConfig()'s value
    help: str
    type: Callable[[str], Any] | None
    choices: tuple[str, ...] | None
    metavar: str | None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def is_bool(self) -> bool:
        return self.type is on_off

    def add_to(self, parser: argparse.ArgumentParser, option: str | None = None) -> argparse.Action:
        """The flag; with `option`, that old spelling of it, hidden from help."""
        shown = option is None
        common: dict[str, Any] = {
            "dest": self.dest, "action": _Setting, "type": self.type, "metavar": self.metavar,
            "help": self.help if shown else argparse.SUPPRESS, "default": self.shown_default if shown else argparse.SUPPRESS,
        }
        if self.is_bool:
            return parser.add_argument(option or self.flag, nargs="?", const=True, **common)
        return parser.add_argument(option or self.flag, choices=self.choices, **common)

    @property
    def shown_default(self) -> Any:
        # A bool's default as the word a user types; `on_off` turns it back into the bool.
        return ("on" if self.default else "off") if self.is_bool else self.default


@dataclass(frozen=True)
class Alias:
    """An old spelling of a round flag, kept for one release. With `const` it is a bare switch that sets the
    setting to that value (`--keep-templates`: train_embedding off); otherwise it takes the flag's value."""

    flag: str
    path: str
    const: Any = None


def _leaf_type(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _flag(path: str, annotation: Any, default: Any, description: str | None) -> RoundFlag | None:
    kind = _leaf_type(annotation)
    choices = None
    if typing.get_origin(kind) is typing.Literal and all(isinstance(c, str) for c in typing.get_args(kind)):
        parse: Callable[[str], Any] | None = None
        choices = typing.get_args(kind)
    elif kind is bool:
        parse = on_off
    elif kind in (int, float):
        parse = kind
    else:
        return None
    section, _, name = path.rpartition(".")
    flag = FLAG_NAMES.get(path) or "--" + PREFIXES.get(section, section.replace("_", "-") + "-") + name.removesuffix("_s").replace("_", "-")
    metavar = "{on,off}" if kind is bool else None if choices else METAVARS.get(path) or ("SECONDS" if name.endswith("_s") else "N" if kind is int else "X")
    text = (description or FALLBACK_HELP.get(path, "")).replace("%", "%%")  # argparse formats help with %
    return RoundFlag(path, flag, default, text, parse, choices, metavar)


def _walk(model: type[BaseModel], values: BaseModel, prefix: str = "") -> Iterable[tuple[str, Any, Any, str | None]]:
    for name, field in model.model_fields.items():
        path = prefix + name
        kind = _leaf_type(field.annotation)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _walk(kind, getattr(values, name), path + ".")
        else:
            yield path, field.annotation, getattr(values, name), field.description


def _table() -> dict[str, RoundFlag]:
    flags = (_flag(path, annotation, default, text) for path, annotation, default, text in _walk(RoundConfig, RoundConfig()) if path not in NOT_FLAGS)
    return {flag.path: flag for flag in flags if flag is not None}


ROUND_FLAGS: dict[str, RoundFlag] = _table()  # RoundConfig's field path -> its flag, in the model's order


def leaf_paths() -> list[str]:
    """Every RoundConfig field that holds a value (sections walked into)."""
    return [path for path, *_ in _walk(RoundConfig, RoundConfig())]


def add_round_flags(parser: argparse.ArgumentParser, paths: Sequence[str], aliases: Sequence[Alias] = ()) -> None:
    """The flags of the settings at `paths` (RoundConfig's order), then each alias, hidden."""
    parser.set_defaults(**{GIVEN: frozenset()})
    for flag in ROUND_FLAGS.values():
        if flag.path in paths:
            flag.add_to(parser)
    for alias in aliases:
        flag = ROUND_FLAGS[alias.path]
        if alias.const is None:
            flag.add_to(parser, alias.flag)
        else:
            parser.add_argument(alias.flag, dest=flag.dest, action=_Setting, nargs=0, const=alias.const,
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def settings(args: argparse.Namespace, paths: Iterable[str]) -> dict[str, Any]:
    """The value of each setting at `paths`: the flag's, or its default."""
    return {path: getattr(args, ROUND_FLAGS[path].dest) for path in paths}


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings a flag (or an alias) set on this command line, by path."""
    given: frozenset[str] = getattr(args, GIVEN, frozenset())
    return {path: getattr(args, flag.dest) for path, flag in ROUND_FLAGS.items() if flag.dest in given}


def nested(flat: Mapping[str, Any], into: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`{"local.lr": 0.1}` as `{"local": {"lr": 0.1}}`, over a copy of `into` (whose other values stay)."""
    tree: dict[str, Any] = copy.deepcopy(dict(into or {}))
    for path, value in flat.items():
        *sections, name = path.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return tree


def flag_text(path: str, value: Any) -> str:
    """The command line that sets `path` to `value`: `--local-lr 0.002`, `--train-embedding off`."""
    flag = ROUND_FLAGS[path]
    return f"{flag.flag} {('on' if value else 'off') if flag.is_bool else value}"


__all__ = ["Alias", "ROUND_FLAGS", "RoundFlag", "add_round_flags", "flag_text", "given_settings", "leaf_paths", "nested", "on_off", "settings"]
