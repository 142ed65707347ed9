"""The command line as a user meets it: one clear error line for each kind of bad input, exit 1 for
runtime errors and 2 for usage errors, help that loads no heavy library and shows every default."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedface import cli
from fedface.cli import main
from fedface.commands import admin_client

HEAVY = ("torch", "fastapi", "sqlalchemy", "uvicorn", "onnxruntime", "facenet_pytorch")


def _fedface(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fedface", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def test_missing_data_root_names_fedface_data(tmp_path: Path) -> None:
    # Execute
    result = _fedface(
        "data", "split", "--out", str(tmp_path / "s.json"), env={"FEDFACE_DATA": str(tmp_path / "nowhere")}
    )
    # Assert: a runtime error, one line
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "FEDFACE_DATA" in result.stderr and "nowhere" in result.stderr


def test_unknown_backbone_lists_the_valid_names(capsys: pytest.CaptureFixture[str], real_data: Path) -> None:
    # Execute
    code = main(["eval", "lfw", "--model", "random", "--backbone", "resnet9000"])
    # Assert
    err = capsys.readouterr().err
    assert code == 1
    assert "unknown backbone 'resnet9000'" in err and "mobilefacenet" in err and "iresnet18" in err


def test_a_model_file_that_is_not_a_checkpoint_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], real_data: Path
) -> None:
    # Prepare
    bogus = tmp_path / "weights.pt"
    bogus.write_text("definitely not torch")
    # Execute
    code = main(["eval", "lfw", "--model", str(bogus)])
    # Assert
    assert code == 1 and "is not a readable torch file" in capsys.readouterr().err


def test_data_split_writes_a_manifest_and_prints_sizes(tmp_path: Path, real_data: Path) -> None:
    # Execute
    result = _fedface("data", "split", "--seed", "3", "--out", str(tmp_path / "split.json"))
    # Assert
    assert result.returncode == 0, result.stderr
    assert "evaluation  2914 identities   7068 images" in result.stdout
    manifest = json.loads((tmp_path / "split.json").read_text())
    assert manifest["config"]["seed"] == 3 and manifest["sizes"]["evaluation"]["identities"] == 2914


def test_version_prints_the_installed_distribution() -> None:
    # Execute
    result = _fedface("--version")
    # Assert
    assert result.returncode == 0 and re.fullmatch(r"fedface \d+\.\d+\.\d+\S*\n", result.stdout), result.stdout


def _parsers(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    if isinstance(parser, cli.Parser):
        parser.populate()
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, f"{path} {name}")
    return found


def _command_paths() -> list[str]:
    """Every command and sub-command, as typed after `fedface` ("" for `fedface` itself)."""
    return [path.removeprefix("fedface").strip() for path, _ in _parsers(cli.build_parser(every_command=True), "fedface")]


@pytest.mark.parametrize("command", _command_paths(), ids=lambda path: path or "fedface")
def test_help_loads_no_heavy_library(command: str) -> None:
    # Prepare: what `fedface [COMMAND ...] --help` does, in a fresh interpreter
    argv = [*command.split(), "--help"]
    probe = (
        "import contextlib, io, sys\nfrom fedface.cli import build_parser\n"
        f"with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        f"    build_parser().parse_args({argv!r})\n"
        f"print(repr(sorted(m for m in {HEAVY!r} if m in sys.modules)), len(out.getvalue()))"
    )
    # Execute
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    # Assert: the help was printed, and none of the heavy libraries was imported to print it
    loaded, help_chars = result.stdout.rsplit(" ", 1)
    assert result.returncode == 0, result.stderr
    assert loaded == "[]" and int(help_chars) > 50


def test_every_command_and_option_has_help_showing_its_default_and_upper_case_metavars() -> None:
    # Prepare
    formatter = cli.HelpFormatter("fedface")
    problems = []
    # Execute
    for path, parser in _parsers(cli.build_parser(every_command=True), "fedface"):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                problems += [f"{path} {choice.dest}: no help" for choice in action._choices_actions if not choice.help]
                continue
            if (
                isinstance(action, argparse._HelpAction)
                or action.help == argparse.SUPPRESS
                or action.dest == argparse.SUPPRESS
            ):
                continue
            name = f"{path} {'/'.join(action.option_strings) or action.dest}"
            text = formatter._get_help_string(action) or ""
            if not text:
                problems.append(f"{name}: no help")
            elif action.nargs != 0 and action.default not in (None, False, argparse.SUPPRESS) and "(default: " not in text:
                problems.append(f"{name}: default {action.default!r} not shown as '(default: ...)'")
            if re.search(r"\(default: (True|False|None)\)", text):
                problems.append(f"{name}: shows a Python value, not what a user types: {text[-40:]!r}")
            if isinstance(action.metavar, str) and not re.fullmatch(r"[A-Z][A-Z0-9_]*|\{[^}]+\}", action.metavar):
                problems.append(f"{name}: metavar {action.metavar!r} is not upper case")
    # Assert
    assert problems == []


def test_usage_errors_exit_2_and_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    # Execute: a value argparse refuses, then values only the server's schema refuses
    with pytest.raises(SystemExit, match="^2$") as bad_choice:
        main(["admin", "round", "open", "--aggregation", "bogus"])
    capsys.readouterr()
    too_few = main(["admin", "round", "open", "--min", "5", "--target", "3", "--server", "http://127.0.0.1:9"])
    too_few_err = capsys.readouterr().err
    two = main(["admin", "round", "open", "--lr", "0", "--trim-beta", "0.7", "--server", "http://127.0.0.1:9"])
    two_err = capsys.readouterr().err
    spreadout = main(["admin", "round", "open", "--spreadout-lr", "0", "--trainable-blocks", "-1", "--server", "http://127.0.0.1:9"])
    spreadout_err = capsys.readouterr().err
    weighting = main(["admin", "round", "open", "--weighting", "devices", "--aggregation", "median", "--local-steps", "0",
                      "--server", "http://127.0.0.1:9"])
    weighting_err = capsys.readouterr().err
    # Assert: checked before any request (nothing listens on port 9), named by flag, never by API field
    assert bad_choice.value.code == 2
    assert too_few == 2 and too_few_err == "fedface admin: error: --min must not exceed --target\n"
    assert two == 2 and "--local-lr 0.0: should be greater than 0; --trim-beta 0.7: should be less than 0.5" in two_err  # --lr: its old spelling
    assert spreadout == 2 and "--trainable-blocks -1: should be greater than or equal to 0" in spreadout_err
    assert "--spreadout-lr 0.0: should be greater than 0" in spreadout_err
    assert weighting == 2 and "--local-steps 0: should be greater than or equal to 1" in weighting_err
    assert "weighting 'devices' is fedavg's; median weighs updates its own way" in weighting_err
    assert "participants" not in too_few_err + two_err and "{" not in too_few_err + two_err


def test_server_validation_errors_are_translated_to_flag_names() -> None:
    # Prepare: a 422 detail as the server sends it
    detail = [
        {"loc": ["body", "aggregation", "trim_beta"], "msg": "Input should be less than 0.5", "type": "less_than"},
        {
            "loc": ["body"],
            "msg": "Value error, selection_window_s must be shorter than deadline_s",
            "type": "value_error",
        },
    ]
    # Execute
    text = admin_client.flag_errors(detail, {"aggregation": {"trim_beta": 0.9}})
    # Assert
    assert text == "--trim-beta 0.9: should be less than 0.5; --selection-window must be shorter than --deadline"


def test_sim_cross_device_refuses_bad_settings_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Execute: settings the simulator's configs or a live round's bounds refuse, before any data is read
    both = main(["sim", "cross-device", "--weighting", "devices", "--dp-epsilon", "1", "--out", str(tmp_path)])
    both_err = capsys.readouterr().err
    steps = main(["sim", "cross-device", "--local-steps", "0", "--out", str(tmp_path)])
    steps_err = capsys.readouterr().err
    # Assert
    assert both == 2 and both_err == "fedface sim: error: weighting devices is FedAvg's: DP-FedAvg weighs every device once already\n"
    assert steps == 2 and steps_err == "fedface sim: error: --local-steps 0: should be greater than or equal to 1\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["demo", "--eval-photos", "7"], "fedface demo: error: --eval-photos 7: at least 20 for 5 folds (a matched and a mismatched pair in each)\n"),
    (["demo", "--folds", "5-6"], "fedface demo: error: --folds 5-6: scores come from the test folds 6-10 only (folds 1-5 hold people that "
                                 "trained the models)\n"),
    (["demo", "--folds", "6"], "fedface demo: error: --folds 6: accuracy sets each fold's threshold on the other folds: name at least 2\n"),
    (["demo", "--folds", "6-11"], "fedface demo: error: --folds 6-11: bad fold spec '6-11': folds are 1..10\n"),
    (["sim", "cross-device", "--folds", "4-7"], "fedface sim: error: --folds 4-7 mixes tuning folds 1-5 with test folds 6-10: choose folds "
                                                "on one side\n"),
    (["sim", "cross-device", "--http", "3", "--folds", "1-5"], "fedface sim: error: --folds 1-5: scores come from the test folds 6-10 only "
                                                               "(folds 1-5 hold people that trained the models)\n"),
    (["sim", "cross-device", "--folds", "6,7", "--eval-photos", "0"], "fedface sim: error: --eval-photos 0: at least 8 for 2 folds (a "
                                                                      "matched and a mismatched pair in each)\n"),
])
def test_a_bad_smaller_evaluation_is_one_usage_error_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Execute: refused before any data is read or server started
    code = main([*argv, "--out", str(tmp_path / "out")])
    # Assert
    assert code == 2 and capsys.readouterr().err == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [
    ["demo", "--devices", "3", "--folds", "6,8", "--eval-photos", "400"],
    ["sim", "cross-device", "--http", "3", "--folds", "6,8", "--eval-photos", "400"],
])
def test_the_demo_and_sim_http_pass_the_smaller_evaluation_on(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Prepare: the demo itself replaced by a recorder; a report as a subset's
    import simulator.demo

    calls: list[dict[str, object]] = []
    scores = {"accuracy": 0.9, "tar_at_far": {"1e-3": 0.5}, "captured": {"accuracy": 0.8, "tar_at_far": {"1e-3": 0.1}}}
    subset = {"photos": 398, "of_photos": 2388, "pairs": 200, "of_pairs": 1200, "seed": 0}

    def run_demo(root: Path, out: Path, *args: object, **kwargs: object) -> dict[str, object]:
        calls.append(kwargs)
        return {"devices": 3, "rounds": 3, "secure_aggregation": False, "folds": [6, 8], "subset": subset, "before": scores, "after": scores}

    monkeypatch.setattr(simulator.demo, "run_demo", run_demo)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # the command sets it for the rest of its process
    # Execute
    code = main([*argv, "--data", str(tmp_path), "--out", str(tmp_path / "out")])
    # Assert: the folds and the photo budget reach the demo, and the output says the figure is on a subset
    out = capsys.readouterr().out
    assert code == 0
    assert calls[0]["folds"] == (6, 8) and calls[0]["eval_photos"] == 400
    assert calls[0]["capture"] == ("lowlight-ir" if argv[0] == "demo" else None)  # the demo's fleet camera; the sim's --capture
    assert "on a seeded subset: 398 of 2,388 photos, 200 of 1,200 View-2 pairs (--eval-photos)" in out


def test_sim_capture_names_the_fleet_cameras_and_refuses_others(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Prepare: the names the parser offers are written out so that parsing stays light
    from facecore.capture import CAPTURES
    from fedface.commands.sim import CAPTURE_NAMES, CENTER_SOURCE_NAMES
    from simulator.cross_device.config import CENTER_SOURCES

    # Execute
    parsed = cli.build_parser().parse_args(["sim", "cross-device", "--capture", "far"])
    with pytest.raises(SystemExit, match="^2$") as refused:
        main(["sim", "cross-device", "--capture", "webcam", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    # Assert
    assert CAPTURE_NAMES == tuple(CAPTURES) and CENTER_SOURCE_NAMES == CENTER_SOURCES
    assert parsed.capture == "far" and cli.build_parser().parse_args(["sim", "cross-device"]).capture is None
    assert refused.value.code == 2 and "--capture: invalid choice: 'webcam'" in err and "'lowlight-ir', 'far'" in err
    assert list(tmp_path.iterdir()) == []


def test_sim_capture_examples_without_data_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Execute
    code = main(["sim", "capture-examples", "--out", str(tmp_path / "grid.png"), "--data", str(tmp_path / "missing")])
    # Assert
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("fedface sim: error: face data not found") and err.count("\n") == 1
    assert not (tmp_path / "grid.png").exists()


def test_a_signal_that_lands_inside_an_import_is_still_the_signal_that_stopped_the_run() -> None:
    # Prepare: what onnxruntime's import raises when SIGHUP arrives during it, and an unrelated error
    import signal

    from facecore.lifetime import Stopped
    from fedface.cli import _stopped_cause

    stopped = Stopped(signal.SIGHUP)
    try:
        try:
            raise stopped
        except Stopped as error:
            raise ImportError("initialization failed") from error
    except ImportError as error:
        wrapped = error
    # Execute / Assert: the Stopped is found behind the import's error; nothing is found behind an unrelated one
    assert _stopped_cause(wrapped) is stopped
    assert _stopped_cause(ValueError("bad")) is None


def test_models_list_reads_the_model_cards_without_torch() -> None:
    # Prepare: the table as the loaded models give it (what `models list` printed when it built them)
    from facecore.align.geometry import geometry_of
    from facecore.errors import FaceCoreError
    from facecore.models.checkpoint import load_backbone, model_source, shipped_verification

    expected = []
    for name in ("default", "mobile", "mobilefacenet"):
        try:
            model = load_backbone(name)
        except FaceCoreError:
            expected.append(f"{name} - - - not available:")
            continue
        shipped = shipped_verification(model)
        assert shipped is not None
        threshold = f"{shipped.threshold:.4f}"
        expected.append(" ".join((name, str(model.name), geometry_of(model).key, threshold, model_source(name))))
    probe = ("import sys\nfrom fedface.cli import main\ncode = main(['models', 'list'])\n"
             f"print(code, sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    # Execute: `fedface models list` in a fresh interpreter
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    # Assert: the same table, from the cards, with no heavy library (torch above all) imported
    assert result.stderr == "0 []\n", result.stderr
    rows = [" ".join(line.split()) for line in result.stdout.splitlines()[1:]]
    assert len(rows) == len(expected) and [row[: len(want)] for row, want in zip(rows, expected)] == expected


def test_token_issue_refuses_a_count_below_one_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    # Execute: refused before any request (nothing listens on port 9)
    zero = main(["admin", "token", "issue", "--count", "0", "--server", "http://127.0.0.1:9"])
    zero_err = capsys.readouterr().err
    both = main(["admin", "token", "issue", "--count", "2000", "--ttl", "5", "--server", "http://127.0.0.1:9"])
    both_err = capsys.readouterr().err
    # Assert: one line naming the flag and its value, never another flag's unset None
    assert zero == 2 and zero_err == "fedface admin: error: --count must be at least 1, got 0\n"
    assert both == 2 and both_err == "fedface admin: error: --count must be at most 1000, got 2000; --ttl must be at least 60 seconds, got 5\n"


def test_an_on_off_option_shows_its_default_as_the_word_and_parses_to_a_bool() -> None:
    # Execute
    shown = " ".join(_fedface("sim", "cross-device", "--help").stdout.split())
    parsed = cli.build_parser().parse_args(["sim", "cross-device"])
    turned_off = cli.build_parser().parse_args(["sim", "cross-device", "--spreadout", "off", "--center-features", "on"])
    # Assert
    assert "--spreadout {on,off} run the spreadout regularizer on the server (default: on)" in shown
    assert (parsed.spreadout, parsed.train_embedding, parsed.public_rehearsal, parsed.center_features) == (True, True, False, False)
    assert (turned_off.spreadout, turned_off.center_features) == (False, True)


def test_fusion_help_shows_the_presets_and_choices_the_simulator_uses() -> None:
    # Prepare: the modules the help leaves unimported, for they load torch
    import dataclasses

    from facecore import fusion
    from fedface.commands import fusion as fusion_command
    from fedface.commands import fusion_faces
    from simulator.fusion import config
    from simulator.fusion.faces import FaceFusionConfig

    # Execute
    presets = {name: {field: getattr(preset, field) for field in fusion_command.PRESET_VALUES[name]} for name, preset in config.PRESETS.items()}
    # Assert
    assert presets == fusion_command.PRESET_VALUES
    assert fusion_command.CHOICES == {"partition": config.PARTITIONS, "fusion": fusion.FUSIONS, "arch": config.ARCHS,
                                      "lambda-bound": fusion.LAMBDA_BOUNDS, "normalize": config.NORMALIZATIONS, "augment": config.AUGMENTATIONS}
    assert fusion_faces.DEFAULTS == dataclasses.asdict(FaceFusionConfig()) and fusion_faces.FUSIONS == fusion.FUSIONS


def test_a_file_the_user_names_that_is_missing_or_cannot_be_made_is_one_line(tmp_path: Path, real_data: Path) -> None:
    # Execute: a package tarball that is not there; a split written under /proc, where no folder can be made
    tarball = _fedface("models", "fetch", "--tarball", str(tmp_path / "face-api.tgz"))
    unwritable = _fedface("data", "split", "--out", "/proc/fedface-no-such-folder/split.json")
    # Assert
    assert tarball.returncode == 1 and tarball.stderr == f"fedface models: error: --tarball {tmp_path / 'face-api.tgz'} does not exist\n"
    assert tarball.stdout == ""
    assert unwritable.returncode == 1 and unwritable.stderr.count("\n") == 1 and "Traceback" not in unwritable.stderr
    assert unwritable.stderr.startswith("fedface data: error: [Errno 2] No such file or directory: '/proc/fedface-no-such-folder")


def test_pretrain_checks_the_models_it_names_before_reading_any_data(tmp_path: Path) -> None:
    # Execute
    init_alone = _fedface("pretrain", "--init", "mobile", "--out", str(tmp_path / "run"))
    teacher = _fedface("pretrain", "--teacher", str(tmp_path / "teacher.pt"), "--out", str(tmp_path / "run"))
    student = _fedface("pretrain", "--teacher", "default", "--init", str(tmp_path / "student.pt"), "--out", str(tmp_path / "run"))
    # Assert: one line each, and no run folder was started
    assert init_alone.returncode == 2 and init_alone.stderr == "fedface pretrain: error: --init is the distillation student's start: it needs --teacher\n"
    assert teacher.returncode == 1 and teacher.stderr.startswith(f"fedface pretrain: error: --teacher: model file {tmp_path / 'teacher.pt'} does not exist")
    assert student.returncode == 1 and student.stderr.startswith(f"fedface pretrain: error: --init: model file {tmp_path / 'student.pt'} does not exist")
    assert not (tmp_path / "run").exists()


def test_pretrain_from_the_teacher_refuses_a_width_or_inner_width_outside_the_family_and_a_second_start(tmp_path: Path) -> None:
    # Execute
    width = _fedface("pretrain", "--from-teacher", "default", "--width", "0.6", "--out", str(tmp_path / "run"))
    both = _fedface("pretrain", "--from-teacher", "default", "--init", "mobile", "--out", str(tmp_path / "run"))
    thin = _fedface("pretrain", "--from-teacher", "default", "--width", "1", "--inner-width", "0.3", "--out", str(tmp_path / "run"))
    missing = _fedface("pretrain", "--from-teacher", str(tmp_path / "teacher.pt"), "--out", str(tmp_path / "run"))

    # Assert: one line each, before any data is read
    assert width.returncode == 2 and width.stderr == "fedface pretrain: error: --width must be one of 0.25, 0.375, 0.5, 0.625, 0.75, got 0.6\n"
    assert both.returncode == 2 and "--from-teacher names both the teacher and the student's start" in both.stderr
    assert thin.returncode == 2 and thin.stderr.startswith("fedface pretrain: error: --width/--inner-width must be one of 1/0.375, 1/0.5, 1/0.5625,")
    assert thin.stderr.endswith(", got 1/0.3\n")
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"fedface pretrain: error: --from-teacher: model file {tmp_path / 'teacher.pt'} does not exist")
    assert not (tmp_path / "run").exists()


# A command module of its own, run by `console` as `fedface fake SKIP`: SKIP says whether it skips the teardown.
CONSOLE = """
import sys, types
from fedface import cli

class Freed:
    def __del__(self):
        print("freed in the teardown", file=sys.stderr, flush=True)

fake = types.ModuleType("fake_command")
fake.kept = Freed()  # held by a module: only the interpreter's teardown frees it
fake.add_arguments = lambda parser: parser.add_argument("skip", choices=("yes", "no"))
fake.run = lambda args: print("ran", end="") or 4
fake.skips_teardown = lambda args: args.skip == "yes"
sys.modules["fake_command"] = fake
cli.COMMANDS["fake"] = ("fake_command", "a test's command")
sys.argv = ["fedface", "fake", sys.argv[1]]
cli.console()
"""


@pytest.mark.parametrize("skip", [True, False])
def test_the_program_skips_the_teardown_only_for_a_command_that_says_so(skip: bool) -> None:
    # Execute
    ended = subprocess.run([sys.executable, "-c", CONSOLE, "yes" if skip else "no"], capture_output=True, text=True,
                           timeout=60)
    # Assert: the command's status and output either way; its module freed only by a teardown
    assert (ended.returncode, ended.stdout) == (4, "ran")
    assert ("freed in the teardown" in ended.stderr) != skip


@pytest.mark.parametrize("action", ["register", "verify", "status", "unenroll", "enroll", "train", "reset"])
def test_only_the_device_actions_that_leave_nothing_open_skip_the_teardown(action: str) -> None:
    # Prepare
    from fedface.commands import device

    # Execute
    skips = device.skips_teardown(argparse.Namespace(action=action))
    # Assert: the four that open no aligner, pool or torch; every other action ends as any program does
    assert skips == (action in ("register", "verify", "status", "unenroll"))


def test_each_count_runs_the_parents_command_with_its_own_count() -> None:
    # Prepare: what the parent process was given, a relative data folder among it
    from fedface_bench.sim import count_command

    parent = ["bench", "sim", "--devices", "10,100", "--trainable-blocks", "3", "--flower", "--data", "../data", "--repeats", "2"]
    # Execute
    command = count_command(parent, 100)
    child = cli.build_parser().parse_args(command[3:])
    # Assert: the count and --json are the child's, every other flag the parent's, the path as given (same folder)
    assert command[1:3] == ["-m", "fedface"]
    assert (child.devices, child.json) == ("100", True)
    assert (child.trainable_blocks, child.flower, child.data, child.repeats) == (3, True, "../data", 2)
