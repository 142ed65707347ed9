"""Issue 37's goal: no `fedface` command shows a user a traceback for a bad argument, a missing file or an
unreachable server.

The commands come from the real parser (fedface.cli.build_parser), so a command added later is checked too.
Each leaf command runs as a real subprocess on a few command lines (see `variants`):
- `all`: every input made bad at once. Every file or folder option (and positional) names a path that does
  not exist, FEDFACE_DATA too; a server option names a server nothing answers on (port 9, discard), a
  database URL a database nothing answers on; every other required argument gets a bogus value (a required
  choice its first choice). A command with none of these gets one free-text option bogus, and one with
  nothing at all an unknown flag.
- `missing FLAG`: one file or folder it reads missing, the rest left to their defaults (the real data).
- `unreachable --server`, `malformed --server`: only the server bad (nothing listening; not a URL), with an
  admin token so the admin commands get that far.
Whichever input a command checks first decides what it reports; each line must end non-zero, without a
traceback, within TIMEOUT_S. The runs go in parallel, one per core, from a module fixture, so the file costs
about its commands' total start-up time over the cores; each line is still its own test.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fedface import cli

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 90  # a command that imports torch on a busy 2-core machine takes seconds; one that starts real work runs far longer
UNREACHABLE_SERVER = "http://127.0.0.1:9"
MALFORMED_SERVER = "http://[::1"  # an IPv6 host without its closing bracket: not a URL an HTTP client can build
UNREACHABLE_DATABASE = "postgresql://nobody@127.0.0.1:9/fedface"
# Option and positional names (argparse dests) that name a file or folder to read or write.
PATH_DESTS = {
    "data", "split", "out", "state", "model", "dir", "tarball", "cacert", "data_dir", "finetune_from", "teacher", "init",
    "report", "manifest", "photos", "runs", "ssl_certfile", "ssl_keyfile",
}
PATH_METAVARS = {"DIR", "FILE", "PATH", "PHOTO", "PNG", "MODEL"}
OUTPUT_DESTS = {"out", "report", "pack_faces"}  # written, not read: a missing one is made
EXISTING_FILE = Path(__file__)  # a file that exists but is no photo, model or manifest
# `fedface server` serves until stopped: with a missing --data-dir it makes that folder and serves, so it is not
# run here; its bad databases and files are checked by tests/server against the real process.
SKIPPED = {"server": "starts a long-running server (tests/server checks its bad inputs)"}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    if isinstance(parser, cli.Parser):
        parser.populate()
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*path, name))


def _is_path(action: argparse.Action) -> bool:
    named = action.dest in PATH_DESTS or action.metavar in PATH_METAVARS
    return named and action.choices is None and action.type in (None, str, Path)


def _is_output(action: argparse.Action) -> bool:
    return action.dest in OUTPUT_DESTS


def _flag(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest.upper()


def variants(parser: argparse.ArgumentParser, missing: Path, outputs: Path) -> dict[str, list[str]]:
    """Command lines for `parser`, each named by what it makes bad: `all` (every input at once), then
    `missing FLAG` for each file or folder the command reads (the others left to their defaults; an output
    goes to a new folder), and `unreachable --server` alone (a state folder, when asked for, is a new empty
    one). Every line names the unreachable server, so none reaches a real one."""
    required: list[str] = []  # what every line needs to parse: the required arguments' bogus values
    required_positionals: list[str] = []
    path_positionals: list[str] = []
    free_text: list[argparse.Action] = []
    readable: list[argparse.Action] = []
    everything: list[str] = []
    server: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.nargs == 0 or (not action.option_strings and action.nargs == "?"):
            continue
        if action.option_strings and action.dest == "server":
            server = [_flag(action), UNREACHABLE_SERVER]
        elif action.option_strings and action.dest == "db":
            everything += [_flag(action), UNREACHABLE_DATABASE]
        elif _is_path(action):
            if not _is_output(action):
                readable.append(action)
            if action.option_strings:
                everything += [_flag(action), str(missing / action.dest)]
            else:
                path_positionals.append(str(missing / action.dest))
        elif action.required:
            value = str(next(iter(action.choices))) if action.choices is not None else "bogus"
            if action.option_strings:
                required += [_flag(action), value]
            else:
                required_positionals.append(value)
        elif action.option_strings and action.choices is None and action.type in (None, str):
            free_text.append(action)
    if not everything and not path_positionals and not server:
        everything = [_flag(free_text[0]), "bogus"] if free_text else ["--no-such-option"]
    lines = {"all": [*server, *everything, *required, *required_positionals, *path_positionals]}

    def alone(bad: argparse.Action | None, server_url: str = UNREACHABLE_SERVER) -> list[str]:
        argv = [*server[:1], server_url, *required] if server else list(required)
        tail: list[str] = []
        for action in parser._actions:
            if not _is_path(action) or action.nargs == 0 or (not action.option_strings and action.nargs == "?"):
                continue
            if action is bad:
                value = str(missing / action.dest)
            elif _is_output(action) or action.dest == "state":
                value = str(outputs / action.dest)
            elif action.required:
                value = str(EXISTING_FILE)
            else:
                continue
            if action.option_strings:
                argv += [_flag(action), value]
            else:
                tail.append(value)
        return [*argv, *required_positionals, *tail]

    # `--data` alone is what `all` already runs (with FEDFACE_DATA missing too), so it is not run again.
    alone_readable = [action for action in readable if action.dest != "data"]
    if len(readable) > 1 or (readable and server):
        lines |= {f"missing {_flag(action)}": alone(action) for action in alone_readable}
    if server and (readable or everything):
        lines["unreachable --server"] = alone(None)
    if server:
        lines["malformed --server"] = alone(None, MALFORMED_SERVER)
    return lines


def _cases() -> list[tuple[tuple[str, ...], str]]:
    scratch = Path("/nonexistent")  # the names only: the fixture builds the real lines under its own folder
    return [(path, name) for path, sub in _leaves(cli.build_parser())
            for name in (["all"] if " ".join(path) in SKIPPED else variants(sub, scratch, scratch))]


CASES = _cases()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[tuple[str, ...], str], subprocess.CompletedProcess[str] | str]:
    """Every line's run (or the word `timeout`), all started at once, one per core."""
    scratch = tmp_path_factory.mktemp("bad_inputs")
    missing = scratch / "missing"
    base = {k: v for k, v in os.environ.items() if k != "FEDFACE_SERVER"} | {"PYTHONUNBUFFERED": "1"}
    commands: dict[tuple[tuple[str, ...], str], tuple[list[str], dict[str, str]]] = {}
    for number, (path, sub) in enumerate(_leaves(cli.build_parser())):
        if " ".join(path) in SKIPPED:
            continue
        for name, argv in variants(sub, missing, scratch / f"outputs{number}").items():
            env = dict(base)
            if name == "all":  # also takes the face data away from the commands without a flag for it
                env["FEDFACE_DATA"] = str(missing / "data_root")
            if name not in ("all", "missing --data-dir"):  # an admin token, so that the admin commands get past it
                env["FEDFACE_ADMIN_TOKEN"] = "not-a-real-token"
            commands[path, name] = ([*path, *argv], env)

    def run(command: tuple[list[str], dict[str, str]]) -> subprocess.CompletedProcess[str] | str:
        argv, env = command
        # A session of its own: a command that got as far as starting a server or workers goes with them on a timeout.
        process = subprocess.Popen([sys.executable, "-m", "fedface", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=env, cwd=scratch, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return "timeout"
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(commands, pool.map(run, commands.values())))


@pytest.mark.parametrize(("path", "variant"), [
    pytest.param(path, variant, id=f"{' '.join(path)}: {variant}") for path, variant in CASES
])
def test_a_bad_input_is_one_clear_error_never_a_traceback(
    path: tuple[str, ...], variant: str, outcomes: dict[tuple[tuple[str, ...], str], subprocess.CompletedProcess[str] | str],
) -> None:
    # Prepare
    if " ".join(path) in SKIPPED:
        pytest.skip(SKIPPED[" ".join(path)])
    # Execute: the run the module fixture made
    result = outcomes[path, variant]
    # Assert: it ended in time, non-zero, and its output holds no traceback
    assert result != "timeout", f"fedface {' '.join(path)} ran past {TIMEOUT_S} s on bad inputs"
    assert isinstance(result, subprocess.CompletedProcess)
    shown = f"$ fedface {' '.join(result.args[3:])}\n{result.stdout[-2000:]}{result.stderr[-4000:]}"
    assert "Traceback" not in result.stdout + result.stderr, shown
    assert result.returncode != 0, shown
