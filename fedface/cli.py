"""`fedface <command> ...`: the one console script.

Invariants:
- Building the parser imports only the command module named on the command line (none for
  `fedface --help`), and command modules import their heavy libraries (torch, FastAPI, MTCNN)
  inside `run`, so every `--help` answers without loading them.
- Exit codes: 0 done; 1 a runtime error (any FaceCoreError: missing data, an unreachable or
  refusing server, a bad file; or an OSError no command turned into one, such as an --out folder that
  cannot be made), printed as one line; 2 a usage error (argparse, or a UsageError
  raised by a command about its flags); 130 interrupted; 141 the reader of stdout went away
  (`fedface ... | head`), quietly, as a command killed by SIGPIPE.
- Ctrl-C (SIGINT), SIGTERM and SIGHUP unwind a command (facecore.lifetime.stopped_by_signals), so the
  servers, worker processes and scratch folders it made go first; then it says so in one line
  (`interrupted`, `stopped by SIGTERM`) and dies of that signal: a shell shows 130, 143 or 129. A command
  module that sets `OWN_SIGNALS` is left to handle them itself (the server: uvicorn shuts down gracefully).
- Every option's help shows its default in one style, `(default: X)`, and metavars are upper case.
- `main` returns the exit status; `console` (the program: `python -m fedface`) exits with it. A command module
  whose `skips_teardown(args)` says so is ended by `console` through facecore.lifetime.exit_now once it has
  returned: threads joined, exit handlers run and output flushed as at any exit, without the interpreter's
  teardown, which a cold one-photo verify would otherwise spend a seventh of its time on.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from facecore.errors import FaceCoreError
from facecore.lifetime import Stopped, die_of, exit_now, stopped_by_signals

# command -> (module with `add_arguments(parser)` and `run(args) -> int`, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("fedface.commands.data", "face data: split identities, align and cache faces, show statistics"),
    "eval": ("fedface.commands.evaluate", "evaluate a backbone on identity-disjoint LFW folds, or on your own photos"),
    "pretrain": ("fedface.commands.pretrain", "pretrain the backbone on public identities (or fine-tune on devices)"),
    "models": (
        "fedface.commands.models",
        "the named models (default, mobile): fetch and verify published weights, list them",
    ),
    "export": ("fedface.commands.export", "export a backbone to ONNX (fp32 and int8) with parity checks"),
    "server": ("fedface.commands.server", "run the cross-device FedFace round server"),
    "admin": (
        "fedface.commands.admin",
        "operate a round server: rounds (open, list, status, close), devices (list, remove, prune), enrollment tokens, model versions and thresholds",
    ),
    "device": (
        "fedface.commands.device",
        "the on-device client: register, enroll, train, verify, personalize, unenroll, status, reset",
    ),
    "demo": (
        "fedface.commands.demo",
        "the whole system on one machine: server + real-face devices over HTTP (make run)",
    ),
    "sim": ("fedface.commands.sim", "simulations: cross-device FedFace (in process or --http), FedFusion, cross-silo"),
    "bench": (
        "fedface.commands.bench",
        "benchmarks (medians and ratios from one run): export, server, device, sim, secagg",
    ),
}
EXIT_RUNTIME_ERROR = 1
EXIT_USAGE_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


class UsageError(Exception):
    """A flag value the command rejects; the message names the flag. Exit status 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to every option that takes a value, has a default and does not already say
    it (a flag such as `--json` or `--no-init-eval` has no value to show); positional arguments show as
    upper case, like the options' metavars."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if text is argparse.SUPPRESS or "(default" in text or "%(default)" in text:
            return text
        default = action.default
        if (
            default in (None, False, argparse.SUPPRESS)
            or action.nargs == 0
            or isinstance(action, argparse._VersionAction)
            or not action.option_strings
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()

    def _get_default_metavar_for_positional(self, action: argparse.Action) -> str:
        return action.dest.upper()


class Parser(argparse.ArgumentParser):
    """The `fedface` parser class; nested sub-commands inherit it, and with it the formatter.
    A parser made by :func:`add_lazy_command` imports its module's arguments only when it
    parses or prints its help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.arguments_from: str | None = None

    def populate(self) -> Parser:
        if self.arguments_from is not None:
            module_name, self.arguments_from = self.arguments_from, None
            importlib.import_module(module_name).add_arguments(self)
        return self

    def parse_known_args(  # type: ignore[override]  # one signature for argparse's three overloads
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.populate()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.populate()
        return super().format_usage()

    def format_help(self) -> str:
        self.populate()
        return super().format_help()


def add_lazy_command(
    subparsers: argparse._SubParsersAction[Any],  # of Parser, or of a plain ArgumentParser (a test's)
    name: str,
    module_name: str,
    help_text: str,
) -> argparse.ArgumentParser:
    """A sub-command whose arguments come from ``module_name.add_arguments``, imported only if used."""
    sub = subparsers.add_parser(name, help=help_text, description=help_text)
    if isinstance(sub, Parser):
        sub.arguments_from = module_name
    else:  # a plain argparse parent (a test's): no laziness to keep
        importlib.import_module(module_name).add_arguments(sub)
    return sub


class _Version(argparse.Action):
    # The installed distribution's version, looked up only when asked for.
    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("fedface")
        except PackageNotFoundError:
            number = "unknown (not installed; run from a source tree)"
        print(f"fedface {number}")
        parser.exit()


def build_parser(every_command: bool = False) -> Parser:
    """The parser; a command's module is imported when that command is parsed (or, with
    ``every_command``, now): importing them is the expensive part of `fedface --help`."""
    parser = Parser(prog="fedface", description="FedFace: federated face recognition.")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = add_lazy_command(commands, name, module_name, help_text)
        sub.set_defaults(_module=module_name)
        if every_command:
            sub.populate()  # type: ignore[attr-defined]
    return parser


def add_detector_option(parser: argparse.ArgumentParser) -> None:
    """`--detector NAME` for a command that detects faces. `main` exports the choice as $FEDFACE_DETECTOR,
    so every aligner of the command, and every process it starts (a server, device workers), uses it."""
    from facecore.align.detectors import DETECTOR_HELP, DETECTORS

    parser.add_argument("--detector", choices=DETECTORS, default=None, help=DETECTOR_HELP)


def _export_detector(args: argparse.Namespace) -> None:
    if getattr(args, "detector", None):  # imported only then: the module brings numpy, which `status` does not need
        from facecore.align.detectors import DETECTOR_ENV

        os.environ[DETECTOR_ENV] = args.detector


def _silence_stdout() -> None:
    # Python flushes stdout again at exit; pointing it at /dev/null keeps that flush quiet too.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _stopped_cause(error: BaseException) -> Stopped | None:
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, Stopped):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _die_stopped(command: str, stopped: Stopped) -> NoReturn:
    print(f"{command}: " + ("interrupted" if stopped.signum == signal.SIGINT else f"stopped by {stopped.name}"), file=sys.stderr)
    die_of(stopped.signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` (default: this process's arguments) and return its exit status."""
    return _run(argv)[0]


def console() -> NoReturn:
    """The program: `main` on this process's arguments, then exit, without the interpreter's teardown when the
    command allows it (see the module's invariants)."""
    code, skip_teardown = _run(None)
    if skip_teardown:
        exit_now(code)
    raise SystemExit(code)


def _run(argv: Sequence[str] | None) -> tuple[int, bool]:
    # (exit status, whether the process may end without the interpreter's teardown: only after the command returned)
    command = "fedface"
    try:
        args = build_parser().parse_args(argv)
        args._argv = list(sys.argv[1:] if argv is None else argv)  # a command that starts itself again passes them on
        command = f"fedface {args.command}"
        _export_detector(args)
        module = importlib.import_module(args._module)
        with stopped_by_signals(enabled=not getattr(module, "OWN_SIGNALS", False)):
            code = int(module.run(args) or 0)
        sys.stdout.flush()
        skips_teardown = getattr(module, "skips_teardown", None)
        return code, bool(skips_teardown is not None and skips_teardown(args))
    except UsageError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE_ERROR, False
    except FaceCoreError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_RUNTIME_ERROR, False
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE, False
    except OSError as error:
        stopped = _stopped_cause(error)
        if stopped is not None:
            _die_stopped(command, stopped)
        # A file or folder the user named that cannot be read or written: its errno and path say what to fix.
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_RUNTIME_ERROR, False
    except Stopped as stopped:
        _die_stopped(command, stopped)
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED, False
    except Exception as error:
        # A signal that lands inside a C extension's import (onnxruntime's) comes back as that
        # import's error, with the Stopped as its cause: it is still the signal that ended the run.
        cause = _stopped_cause(error)
        if cause is None:
            raise
        _die_stopped(command, cause)
