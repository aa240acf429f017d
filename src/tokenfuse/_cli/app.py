"""``tokenfuse``: the operator's command line (also ``python -m tokenfuse``).

Every command reads the deployment's store and policy from the same place the guards do (the
``TOKENFUSE_*`` environment; ``--redis URL`` wins over ``TOKENFUSE_REDIS_URL``), and works
through ``tokenfuse.admin.Admin``. Output is for people (``rich`` tables, the ``cli`` extra)
unless ``--json`` asks for data. Exit status: 0 done, 1 the key or the operation failed, 2 the
command line or the setup is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .._admin.refs import KeyRef
from .._admin.service import Admin
from .._admin.views import SORTS, KeyView
from .._errors import ConfigurationError, TokenFuseError
from .._events import FuseEvent
from .._stores.ops import UNSET, Unset

__all__ = ["main"]

_NO_STORE = (
    "no shared store: pass --redis URL or set TOKENFUSE_REDIS_URL (the store this process would "
    "use on its own is empty; `tokenfuse demo` needs none)"
)
_PIPE_WIDTH = 150
_NO_RICH = (
    "tokenfuse's terminal output needs the rich package: pip install 'tokenfuse[cli]' "
    "(or pass --json)"
)


class CommandError(Exception):
    """What to tell the user, and the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# -- the command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenfuse",
        description="See and steer tokenfuse: keys, limits, events, replays of recorded usage.",
        epilog="KEY is a key id (shown next to every label) or a name; a credential is passed "
        "as one with --secret (use '-' to read it from standard input).",
    )
    parser.add_argument("--redis", metavar="URL", help="the shared store (TOKENFUSE_REDIS_URL)")
    parser.add_argument("--prefix", help="its key prefix (TOKENFUSE_REDIS_PREFIX)")
    parser.add_argument("--json", action="store_true", help="print data for scripts")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help)

    status = command("status", "one key in detail, or a summary of every key")
    _key_arguments(status, required=False)
    top = command("top", "a live table of the keys, busiest first")
    top.add_argument("--sort", choices=SORTS, default="rate")
    top.add_argument("--limit", type=int, default=20, help="rows (default 20)")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one table and stop")
    top.add_argument("--fuse", help="only this fuse's keys (default, inbound, ...)")
    command("blocked", "the keys refusing every call now").add_argument("--fuse")
    _key_arguments(command("reset", "close a key now, clear its window, refill its bucket"))
    _key_arguments(command("forgive", "forgive a key's last trip (where available)"))
    set_limit = command("set-limit", "set a key's manual ceiling per minute, live")
    _key_arguments(set_limit)
    set_limit.add_argument("limit", metavar="RATE", help="50k/min, 1M/hour, or 'none' to clear")
    set_bucket = command("set-bucket", "change a caller's bucket, live")
    _key_arguments(set_bucket)
    set_bucket.add_argument("--rate", help="refill: 10/s, 600/min ('none': the policy's)")
    set_bucket.add_argument("--capacity", help="the burst it may spend ('none': the policy's)")
    events = command("events", "the latest events; --follow for each new one")
    events.add_argument("--follow", "-f", action="store_true")
    events.add_argument("--limit", type=int, default=50)
    replay = command("replay", "replay recorded usage through a policy: when would it trip?")
    replay.add_argument("file", help="CSV or JSONL of timestamp, key, tokens")
    replay.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for this replay, e.g. limit=50k/min or spike_multiple=8 (repeatable, "
        "or comma-separated); the rest comes from the TOKENFUSE_* environment",
    )
    replay.add_argument("--inbound", action="store_true", help="rows are calls to a tool API")
    replay.add_argument(
        "--keys",
        choices=("auto", "name", "secret"),
        default="auto",
        help="what the key column holds (auto: credentials are recognised and hidden)",
    )
    demo = command("demo", "watch a runaway agent loop be stopped (no Redis, no network)")
    demo.add_argument("--pace", type=float, default=0.15, help="real seconds per looping call")
    dashboard = command(
        "dashboard",
        "serve the web dashboard (token: TOKENFUSE_ADMIN_TOKEN; without one, loopback only)",
    )
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dashboard.add_argument("--port", type=int, default=8787, help="port to listen on")
    dashboard.add_argument("--fuse", help="the fuse whose keys to show (default: the first)")
    command("config", "the settings in force (TOKENFUSE_* and --redis), secrets hidden")
    return parser


def _key_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("key", metavar="KEY", nargs=None if required else "?")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--id", dest="kind", action="store_const", const="id", help="KEY is a key id")
    kind.add_argument(
        "--name", dest="kind", action="store_const", const="name", help="KEY is a name"
    )
    kind.add_argument(
        "--secret",
        dest="kind",
        action="store_const",
        const="secret",
        help="KEY is a credential ('-': read it from standard input); hashed, never shown",
    )
    parser.add_argument("--fuse", help="only in this fuse (default, inbound, ...)")


# -- running a command ------------------------------------------------------------------------


class Cli:
    """One invocation: its arguments, where it writes, and the admin it works through."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> None:
        self.args = args
        self.out = out
        self.err = err
        self.stdin = stdin
        self._admin: Admin | None = None

    # output

    def console(self) -> Any:
        try:
            from rich.console import Console
        except ImportError:
            raise CommandError(_NO_RICH, 2) from None
        # Piped output has no width of its own: wide enough for a table row per key.
        wide = None if self.out.isatty() or "COLUMNS" in os.environ else _PIPE_WIDTH
        return Console(file=self.out, width=wide, highlight=False, soft_wrap=False)

    def data(self, value: object) -> None:
        json.dump(value, self.out, indent=2, default=_jsonable)
        self.out.write("\n")

    def show(self, value: object, human: Callable[[Any], None]) -> None:
        """``value`` as JSON with ``--json``; else ``human(console)`` draws it."""
        if self.args.json:
            self.data(value)
        else:
            human(self.console())

    # the deployment

    def admin(self) -> Admin:
        if self._admin is None:
            from .._settings import configure, current

            changes: dict[str, object] = {}
            if self.args.redis:
                changes["redis_url"] = self.args.redis
            if self.args.prefix:
                changes["redis_prefix"] = self.args.prefix
            settings = configure(**changes) if changes else current()
            if settings.redis_url is None:
                raise CommandError(_NO_STORE, 2)
            self._admin = Admin()
        return self._admin

    def ref(self) -> KeyRef:
        text, kind = self.args.key, self.args.kind
        if kind == "secret":
            return KeyRef.secret(self.stdin.readline() if text == "-" else text)
        if kind == "id":
            return KeyRef.key_id(text)
        if kind == "name":
            return KeyRef.name(text)
        return KeyRef.parse(text)


def _jsonable(value: object) -> object:
    if isinstance(value, KeyView):
        return value.as_dict()
    if isinstance(value, FuseEvent):
        return _event_data(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _event_data(event: FuseEvent) -> dict[str, object]:
    from .._alerts import payload

    return {name: value for name, value in payload(event).items() if name != "text"}


# -- the commands -----------------------------------------------------------------------------


def _status(cli: Cli) -> None:
    admin = cli.admin()
    if cli.args.key is None:
        views = admin.keys(sort="state")
        counts = {
            state: sum(view.state == state for view in views)
            for state in ("open", "near", "ok", "idle")
        }

        def summary(console: Any) -> None:
            from .render import key_table

            line = ", ".join(f"{count} {state}" for state, count in counts.items())
            console.print(f"{len(views)} keys: {line}")
            console.print(key_table(views[:20]))

        cli.show({"counts": counts, "keys": views[:20]}, summary)
        return
    found = admin.find(cli.ref(), fuse=cli.args.fuse)

    def details(console: Any) -> None:
        from .render import key_detail

        for view in found:
            console.print(key_detail(view))

    cli.show(found, details)


def _top(cli: Cli) -> None:
    from .top import run_top

    args = cli.args
    admin = cli.admin()
    if args.json:
        cli.data(admin.keys(fuse=args.fuse, sort=args.sort, limit=args.limit))
        return
    run_top(
        admin,
        cli.console(),
        sort=args.sort,
        limit=args.limit,
        interval=args.interval,
        fuse=args.fuse,
        frames=1 if args.once else None,
    )


def _blocked(cli: Cli) -> None:
    views = cli.admin().blocked(fuse=cli.args.fuse)

    def table(console: Any) -> None:
        from .render import key_table

        if not views:
            console.print("no key is open")
        else:
            console.print(key_table(views, title=f"{len(views)} open"))

    cli.show(views, table)


def _changed(cli: Cli, views: Sequence[KeyView], done: str) -> None:
    def lines(console: Any) -> None:
        from .render import key_table

        console.print(f"{done} ({len(views)} fuse{'s' if len(views) != 1 else ''})")
        console.print(key_table(views))

    cli.show(list(views), lines)


def _reset(cli: Cli) -> None:
    _changed(cli, cli.admin().reset(cli.ref(), fuse=cli.args.fuse), "reset")


def _forgive(cli: Cli) -> None:
    _changed(cli, cli.admin().forgive(cli.ref(), fuse=cli.args.fuse), "forgiven")


def _optional(text: str | None) -> str | None | Unset:
    if text is None:
        return UNSET
    return None if text.strip().lower() in ("none", "policy", "off") else text


def _set_limit(cli: Cli) -> None:
    limit = _optional(cli.args.limit)
    view = cli.admin().set_limit(
        cli.ref(), None if isinstance(limit, Unset) else limit, fuse=cli.args.fuse
    )
    _changed(cli, [view], "limit set")


def _set_bucket(cli: Cli) -> None:
    rate, size = _optional(cli.args.rate), _optional(cli.args.capacity)
    if isinstance(rate, Unset) and isinstance(size, Unset):
        raise CommandError("set-bucket: give --rate, --capacity or both", 2)
    capacity = _capacity(size) if isinstance(size, str) else size
    view = cli.admin().set_bucket(cli.ref(), rate=rate, capacity=capacity, fuse=cli.args.fuse)
    _changed(cli, [view], "bucket set")


def _capacity(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CommandError(f"--capacity must be a number, not {text!r}", 2) from None


def _events(cli: Cli) -> None:
    admin = cli.admin()
    if not admin.feed.cross_process:
        cli.err.write(
            "note: this shows the events of this process only; on a Redis store "
            "(--redis, TOKENFUSE_REDIS_URL) every process's are logged\n"
        )
    shown = admin.events(cli.args.limit)
    for event in shown:
        _print_event(cli, event)
    if cli.args.follow:
        stop = threading.Event()
        try:
            for event in admin.follow(stop):
                _print_event(cli, event)
        except KeyboardInterrupt:
            stop.set()


def _print_event(cli: Cli, event: FuseEvent) -> None:
    if cli.args.json:
        cli.out.write(json.dumps(_event_data(event)) + "\n")  # one object per line: follows
        cli.out.flush()
        return
    from .render import event_line

    cli.console().print(event_line(event))


def _replay(cli: Cli) -> None:
    from .._replay import replay_file
    from .._settings import current

    settings = current()
    for item in cli.args.policy:
        for pair in item.split(","):
            name, eq, value = pair.partition("=")
            if not eq:
                raise CommandError(f"--policy takes NAME=VALUE pairs, not {pair!r}", 2)
            settings = settings.updated(**{name.strip(): value.strip()})
    result = replay_file(cli.args.file, settings, inbound=cli.args.inbound, keys=cli.args.keys)

    def report(console: Any) -> None:
        from .replay_view import replay_report

        console.print(replay_report(result))

    cli.show(result.as_dict(), report)


def _demo(cli: Cli) -> int:
    from .demo import run_demo

    return run_demo(cli.out, pace=cli.args.pace)


def _dashboard(cli: Cli) -> int:
    from .. import admin
    from .._settings import current

    chosen = cli.admin().fuses
    fuse = (
        next((f for f in chosen if f.name == cli.args.fuse), None) if cli.args.fuse else chosen[0]
    )
    if fuse is None:
        cli.err.write(f"no fuse named {cli.args.fuse!r} here\n")
        return 2
    token = current().admin_token
    where = f"http://{cli.args.host}:{cli.args.port}/"
    cli.err.write(
        f"the dashboard of fuse {fuse.name!r}: {where}"
        + ("" if token else " (loopback only, no token)")
        + "\n"
    )
    admin.serve(
        fuse,
        host=cli.args.host,
        port=cli.args.port,
        token=token,
        allow_no_token_on_loopback=token is None,
    )
    return 0


def _config(cli: Cli) -> None:
    from .._settings import configure, current

    changes = {"redis_url": cli.args.redis} if cli.args.redis else {}
    shown = (configure(**changes) if changes else current()).describe()

    def table(console: Any) -> None:
        for name, value in shown.items():
            console.print(f"{name:<18} {value}")

    cli.show(shown, table)


_COMMANDS: dict[str, Callable[[Cli], int | None]] = {
    "status": _status,
    "top": _top,
    "blocked": _blocked,
    "reset": _reset,
    "forgive": _forgive,
    "set-limit": _set_limit,
    "set-bucket": _set_bucket,
    "events": _events,
    "replay": _replay,
    "demo": _demo,
    "dashboard": _dashboard,
    "config": _config,
}


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Run one ``tokenfuse`` command; its exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    args = _parser().parse_args(argv)
    cli = Cli(args, out, err, stdin or sys.stdin)
    try:
        return _COMMANDS[args.command](cli) or 0
    except CommandError as exc:
        err.write(f"tokenfuse {args.command}: {exc}\n")
        return exc.status
    except ConfigurationError as exc:  # a bad value on the command line or in the environment
        err.write(f"tokenfuse {args.command}: {exc}\n")
        return 2
    except (TokenFuseError, OSError) as exc:
        err.write(f"tokenfuse {args.command}: {exc}\n")
        return 1
