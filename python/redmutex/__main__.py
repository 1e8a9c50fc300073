"""`python -m redmutex COMMAND` (or the `redmutex` console script): the command line.

Each command is a subparser with a handler `(args) -> exit code`: `demo` here, `status`, `list`
and `release` in `_cli` (exit codes documented there). Every error is one line on stderr and a
non-zero exit code, with any password taken out of the message.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from redmutex._cli import CliError, add_commands, discard_output, reader_gone
from redmutex._core import _redact_text

EXIT_ERROR = 2  # the command could not do its job (bad arguments, Redis unreachable, ...)
EXIT_INTERRUPTED = 130
EXIT_READER_GONE = 141  # 128 + SIGPIPE (13): what a shell reports of a writer killed by SIGPIPE


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (subparsers inherit this class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {_redact_text(message)}\n")


def _redis_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="Redis URL, e.g. redis://127.0.0.1:6379/0 (default: $REDIS_URL)",
    )


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {number}")
    return number


def _cmd_demo(args: argparse.Namespace) -> int:
    from redmutex._demos import transfers

    try:
        code = transfers.main(args.redis, processes=args.processes, transfers=args.transfers)
        sys.stdout.flush()  # here, not at exit, where a reader gone would be reported
        return code
    except transfers.DemoError as exc:
        _fail(str(exc), args)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader of its output went away (`demo | head`): as status and list take that,
        # not an error of ours. The demo stops there (it cleaned up on the way out: its worker
        # processes and private redis-server are stopped) and exits quietly as a program killed
        # by SIGPIPE would, since its checks did not all run.
        if not reader_gone(sys.stdout):
            raise
        discard_output(sys.stdout)
        return EXIT_READER_GONE


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=_prog(),
        description="redmutex: distributed locks on Redis.",
    )
    parser.add_argument("--version", action="version", version=f"redmutex {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="money transfers under redis_lock, a fair hand-off, a semaphore (several processes)",
        description="Runs the money-transfer example of the API from several processes and"
        " checks that the total is conserved and no balance goes negative; then shows a fair"
        " lock granted in arrival order across processes, and a semaphore holding a limit."
        " Exits non-zero if any of these breaks. Without --redis or $REDIS_URL it starts (and"
        " afterwards stops) a private redis-server.",
    )
    _redis_option(demo)
    demo.add_argument("--processes", type=_positive_int, default=6, help="default: 6")
    demo.add_argument(
        "--transfers", type=_positive_int, default=300, help="per process (default: 300)"
    )
    demo.set_defaults(handler=_cmd_demo)
    add_commands(commands)
    return parser


def _prog() -> str:
    """`redmutex` when run as the console script, `python -m redmutex` otherwise."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "redmutex" if script == "redmutex" else "python -m redmutex"


def _version() -> str:
    from redmutex import __version__

    return str(__version__)


def _fail(message: str, args: argparse.Namespace | None) -> None:
    given: list[str] = []
    for option in ("redis", "cluster"):
        value = getattr(args, option, None) or []
        given += [value] if isinstance(value, str) else value
    urls = given or [os.environ.get("REDIS_URL") or ""]
    print(f"redmutex: error: {_redact_text(message, urls)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("redmutex: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CliError as exc:  # a failure the command already put into words
        _fail(str(exc), args)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the CLI reports every failure as one line
        _fail(f"{type(exc).__name__}: {exc}", args)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
