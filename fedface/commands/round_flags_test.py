"""The round-flag table against the two commands that take it: `fedface admin round open` and `fedface sim
cross-device` give each shared setting one name, one default and one help, and mean the same setting by it;
the old spellings still parse; every command line the docs show still parses and checks."""
from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from facecore.federation.config import RoundConfig
from facecore.federation.fleet_camera import fleet_camera_settings
from fedface import cli
from fedface.commands import admin, round_flags, sim
from fedface.commands.round_flags import NOT_FLAGS, ROUND_FLAGS, leaf_paths
from simulator.cross_device.config import LEGACY_DEFAULTS, CrossDeviceConfig

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "simulator/REPORT.md", "server_api/README.md", "Makefile")
OPEN = ("admin", "round", "open")
CROSS_DEVICE = ("sim", "cross-device")
CENTER = [0.6, 0.8]


def _subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = cli.build_parser(every_command=True)
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        if isinstance(sub, cli.Parser):
            sub.populate()
        parser = sub
    return parser


def _table_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's visible round flags, by setting. A problem: an action that sets a round setting but was
    not made by the table (a flag added by hand), or a round flag's name shown for another setting."""
    dests = {flag.dest: path for path, flag in ROUND_FLAGS.items()}
    names = {flag.flag for flag in ROUND_FLAGS.values()}
    hidden = argparse.SUPPRESS
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        path = dests.get(action.dest)
        if path is None:
            assert action.help == hidden or not names & set(action.option_strings), f"{action.option_strings} is a round flag's name"
            continue
        assert type(action).__name__ == "_Setting", f"{action.option_strings} sets {path}: add it with round_flags.add_round_flags"
        if action.help != hidden:  # an old spelling (round_flags.Alias) is hidden
            assert action.option_strings == [ROUND_FLAGS[path].flag]
            found[path] = action
    return found


def _spec(action: argparse.Action) -> tuple[Any, ...]:
    return (action.option_strings, action.dest, action.default, action.help, action.type, action.choices, action.metavar, action.nargs,
            action.const)


def _parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def _at(config: RoundConfig, path: str) -> Any:
    value: Any = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


def test_every_round_config_field_is_a_flag_or_says_why_not() -> None:
    # Execute
    fields = leaf_paths()
    # Assert
    assert sorted(fields) == sorted([*ROUND_FLAGS, *NOT_FLAGS])
    assert len({flag.flag for flag in ROUND_FLAGS.values()}) == len(ROUND_FLAGS)


def test_both_commands_expose_each_shared_setting_with_one_name_default_and_help() -> None:
    # Prepare
    admin_flags = _table_actions(_subparser(OPEN))
    sim_flags = _table_actions(_subparser(CROSS_DEVICE))
    defaults = RoundConfig()
    # Execute
    shared = sorted(admin_flags.keys() & sim_flags.keys())
    # Assert: round open takes every setting and the simulator the ones it honours, each as the table makes it
    assert list(admin_flags) == list(ROUND_FLAGS) and sorted(sim_flags) == sorted(sim.SIM_SETTINGS) == shared
    for path in shared:
        flag, action = ROUND_FLAGS[path], admin_flags[path]
        assert _spec(action) == _spec(sim_flags[path]), path
        parsed = action.type(action.default) if isinstance(action.default, str) and callable(action.type) else action.default
        assert parsed == _at(defaults, path), path
        field = _at_field(path)
        assert action.help == (field.description or round_flags.FALLBACK_HELP[path]).replace("%", "%%") and action.help, path
        assert flag.flag == action.option_strings[0]


def _at_field(path: str) -> Any:
    model: Any = RoundConfig
    *sections, name = path.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_fields[name]


def _changed(path: str) -> str:
    """A value for the setting other than its default, inside its bounds."""
    flag = ROUND_FLAGS[path]
    if flag.is_bool:
        return "off" if flag.default else "on"
    if flag.choices:
        return next(c for c in flag.choices if c != flag.default)
    if path in ("local.upload_bits", "local.download_bits"):  # 8 or 4 only; 8 only
        return "8"
    if flag.default is None or flag.default == 0:
        return "2" if flag.type is int else "0.5"
    return str(flag.default + 1) if flag.type is int else str(flag.default / 2)


def test_a_flag_sets_the_same_round_setting_in_both_commands() -> None:
    # Prepare: every shared setting away from its default, on both command lines
    shown = [p for p in sim.SIM_SETTINGS if p != "secure_aggregation.enabled"]  # a live round's: the sim runs it with --http only
    argv = [token for path in shown for token in (ROUND_FLAGS[path].flag, _changed(path))]
    # Execute
    opened = RoundConfig.model_validate(admin._round_config(_parse(*OPEN, "--settings", "paper", *argv), None))
    simulated = sim.cross_device_config(_parse(*CROSS_DEVICE, *argv)).round_config(devices=100)
    # Assert
    assert {p: _at(opened, p) for p in shown} == {p: _at(simulated, p) for p in shown}
    assert all(_at(opened, p) != _at(RoundConfig(), p) for p in shown)


def test_old_spellings_still_parse_as_hidden_aliases() -> None:
    # Execute
    old = admin._round_config(_parse(*OPEN, "--lr", "0.1", "--keep-templates"), None)
    new = admin._round_config(_parse(*OPEN, "--local-lr", "0.1", "--train-embedding", "off"), None)
    old_sim = sim.cross_device_config(_parse(*CROSS_DEVICE, "--dp-clip", "0.5"))
    new_sim = sim.cross_device_config(_parse(*CROSS_DEVICE, "--max-update-norm", "0.5"))
    # Assert
    assert old == new == {"local": {"lr": 0.1, "train_embedding": False}}
    assert old_sim == new_sim and old_sim.dp_clip == 0.5
    assert not re.search(r"--lr\b|--keep-templates", _subparser(OPEN).format_help())
    assert "--dp-clip" not in _subparser(CROSS_DEVICE).format_help()


def test_round_open_flags_override_the_preset_and_unset_ones_leave_it() -> None:
    # Execute: fleet-camera (a centre) and paper (none); a flag given at the schema's default still overrides
    preset = admin._round_config(_parse(*OPEN), CENTER)
    secure = admin._round_config(_parse(*OPEN, "--secure-aggregation"), CENTER)
    given = admin._round_config(_parse(*OPEN, "--local-lr", "0.01", "--spreadout-steps", "3", "--weighting", "samples"), CENTER)
    paper = admin._round_config(_parse(*OPEN, "--settings", "paper", "--spreadout-center"), None)
    # Assert
    assert preset == fleet_camera_settings(CENTER)
    assert secure == round_flags.nested({"secure_aggregation.enabled": True}, fleet_camera_settings(CENTER, secure_aggregation=True))
    expected = fleet_camera_settings(CENTER)
    expected["local"]["lr"], expected["spreadout"]["steps"], expected["aggregation"]["weighting"] = 0.01, 3, "samples"
    assert given == expected
    assert paper == {"spreadout": {"center": True}}


def test_round_open_names_the_flag_of_a_value_the_schema_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    # Execute
    code = cli.main([*OPEN, "--train-embedding", "off", "--spreadout-momentum", "1", "--secagg-scale-bits", "30",
                     "--server", "http://127.0.0.1:9"])
    # Assert
    err = capsys.readouterr().err
    assert code == 2 and "--spreadout-momentum 1.0: should be less than 1" in err and "--secagg-scale-bits 30: should be less" in err


def test_sim_cross_device_checks_a_live_round_bound_by_its_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Execute: a device learning rate RoundConfig refuses, before any data is read
    code = cli.main([*CROSS_DEVICE, "--local-lr", "20", "--out", str(tmp_path)])
    # Assert
    assert code == 2 and capsys.readouterr().err == "fedface sim: error: --local-lr 20.0: should be less than or equal to 10\n"
    assert list(tmp_path.iterdir()) == []


def _variants(command: str) -> list[str]:
    """A documented command, each optional `[...]` part left out and put in."""
    match = re.search(r"\[([^\[\]]*)\]", command)
    if match is None:
        return [command]
    return [*_variants(command[: match.start()] + command[match.end():]), *_variants(command[: match.start()] + match[1] + command[match.end():])]


# Named in prose, not run: the mode, its N left out.
MENTIONS = ("fedface sim cross-device --http",)


def _placeholder(token: str) -> bool:
    # N, NAME, ADDRESS: a metavariable; `a|b`, `...`, `-lr/-steps`: a summary, not a command line
    return bool(re.fullmatch(r"[A-Z][A-Z_]*", token)) or "|" in token or "..." in token or "/-" in token


def _documented_commands() -> list[tuple[str, str]]:
    """(where, command line) of every `round open` and `sim cross-device` in the docs: fenced lines (with `\\`
    continuations joined and a `S="..."` variable of the same block expanded) and inline code that starts with one."""
    found = []
    for name in DOCS:
        path = REPO / name
        if not path.is_file():
            continue
        fenced, variables = name == "Makefile", dict[str, str]()
        for number, line in enumerate(path.read_text().replace("\\\n", " ").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced, variables = not fenced, {}
                continue
            if fenced and (assignment := re.fullmatch(r'\s*(\w+)="(.*)"\s*', line)):
                variables[assignment[1]] = assignment[2]
            expanded = line
            for variable, value in variables.items():
                expanded = expanded.replace(f"${variable}", value)
            spans = [expanded] if fenced and "=" not in expanded.split("fedface", 1)[0] else re.findall(r"`([^`]+)`", line)
            for span in spans:
                for command in ("fedface admin round open", "fedface sim cross-device"):
                    start = span.find(command)
                    if start >= 0 and (fenced or start == 0):
                        found += [(f"{name}:{number}", variant) for variant in _variants(span[start:])]
    return [(where, command) for where, command in found
            if command.strip() not in MENTIONS and not any(map(_placeholder, shlex.split(command, comments=True)))]


def test_every_documented_round_open_and_sim_cross_device_command_still_parses_and_checks() -> None:
    # Prepare
    commands = _documented_commands()
    problems = []
    # Execute: the real parser, then what each command checks before it contacts a server or reads data
    for where, command in commands:
        argv = shlex.split(command, comments=True)[1:]
        try:
            args = _parse(*argv)
            if argv[:3] == list(OPEN):
                admin._round_config(args, None)
            elif not args.http:
                sim.cross_device_config(args)
        except (SystemExit, cli.UsageError) as error:
            problems.append(f"{where}: {command}: {error}")
    # Assert
    assert problems == []
    assert len(commands) >= 40 and {c.split()[1] for _, c in commands} == {"admin", "sim"}


# The config a checkpoint of runs/issue35-lowlight-s0-celeba-centre holds (its report.json), less what a
# resumed run may change (engine.Simulation.load: the rounds, the evaluation cadence, where devices train).
ISSUE35_CONFIG = {
    "devices": 217, "per_round": 217, "method": "fedface", "init": "mean", "spreadout": False, "seed": 0, "model": "default",
    "eval_folds": [6, 7, 8, 9, 10], "eval_photos": None, "owner_holdout": 0.3,
    "local": {"epochs": 1, "steps": None, "lr": 0.002, "momentum": 0.9, "margin": 0.9, "batch": 32, "flip": True, "bn_mode": "frozen",
              "trainable_blocks": 4, "train_embedding": False, "feature_center": None, "exact_losses": True, "negative_scale": 64.0,
              "negative_margin": 0.35},
    "server_spreadout": {"nu": 0.3, "steps": 10, "lr": 0.01, "momentum": 0.9, "center": False},
    "dp_epsilon": None, "dp_clip": 1.0, "dp_delta": 1e-05, "template_noise_cos": None, "public_negatives": 0, "public_rehearsal": False,
    "selection": "least_recent", "wire": "fp16", "seeding": "live", "weighting": "devices", "server_momentum": 0.9,
    "capture": "lowlight-ir", "enrolment": "clean", "train_enrolment": False, "center_features": True, "center_source": "celeba",
    "upload_bits": None, "download_bits": None,
}
RESUMABLE = ("rounds", "eval_every", "target_accuracy", "workers", "backend", "ray_address")


def test_the_documented_issue35_command_still_means_its_checkpoints_config() -> None:
    # Prepare: simulator/REPORT.md's live-path command, with the CelebA centre of the run beside it
    command = next(c for w, c in _documented_commands() if "runs/issue35-lowlight-s0" in c)
    argv = [*shlex.split(command)[1:], "--center-source", "celeba", "--out", "runs/issue35-lowlight-s0-celeba-centre"]
    saved = REPO / "runs/issue35-lowlight-s0-celeba-centre/report.json"
    # Execute
    config = json.loads(json.dumps(sim.cross_device_config(_parse(*argv)).to_dict()))
    # Assert
    meaning = {k: v for k, v in config.items() if k not in RESUMABLE}
    assert meaning == ISSUE35_CONFIG
    if saved.is_file():  # the run itself, where this checkout has it (runs/ is not in git)
        # a field added since reads as what the checkpoint resumes with (LEGACY_DEFAULTS)
        assert meaning == {k: v for k, v in {**LEGACY_DEFAULTS, **json.loads(saved.read_text())["config"]}.items() if k not in RESUMABLE}


def test_sim_cross_device_without_flags_is_the_simulators_default_run() -> None:
    # Execute
    config = sim.cross_device_config(_parse(*CROSS_DEVICE))
    # Assert: RoundConfig's defaults, as flags, are the simulator's own: a checkpoint means what it meant
    assert config == CrossDeviceConfig()
