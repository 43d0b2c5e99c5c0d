"""The `obelisk` command line: the server, and a client of its REST API.

    obelisk server run --deployment FILE [--data-dir DIR] [--api-listen HOST:PORT]
        [--allow-unauthenticated-api] [--cpu-affinity split|off]
        [--database-url URL | --config FILE]
    obelisk execution submit FFQN '[json params]' [--follow] [--json]
    obelisk execution list [--ffqn PREFIX] [--state S] [--hide-finished] [--limit N] [--json]
    obelisk execution status|result|events|responses|logs ID [--json]
    obelisk execution pause|unpause|cancel ID
    obelisk execution cancel --force ID
    obelisk execution stub ID '{"ok": value}'
    obelisk execution persist-backtraces ID [--json]
    obelisk delay cancel ID
    obelisk component list [--json]
    obelisk deployment status [--json]

The API address comes from `--api-url` (or `OBELISK_API_URL`, default
http://127.0.0.1:5005), the token from `OBELISK_API_TOKEN`. Output is for humans unless
`--json` is given. Errors print one `error: …` line to stderr and exit 1 (2 for usage).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from engine.affinity import parse_processes
from engine.client import DEFAULT_API_URL, ApiClient, ApiError, ServerUnreachable, api_url_problem
from engine.views import (
    STATE_NAMES,
    ComponentInfo,
    EventEntry,
    ExecutionInfo,
    LogEntry,
    ResponseEntry,
    lock_held,
    upgrades_unchecked,
)

API_URL_ENV = "OBELISK_API_URL"
TOKEN_ENV = "OBELISK_API_TOKEN"


class UsageError(Exception):
    """A bad command line detected before talking to the server (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


# ---------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------

_STATE_LABELS = {
    "pending_at": "PendingAt",
    "locked": "Locked",
    "blocked_by_join_set": "BlockedByJoinSet",
    "paused": "Paused",
    "cancelling": "Cancelling",
    "finished": "Finished",
}


def format_state(state: dict[str, Any]) -> str:
    """`PendingAt`, `Paused(BlockedByJoinSet)`, `Finished(ok)`, …"""
    kind = str(state.get("type"))
    label = _STATE_LABELS.get(kind, kind)
    underlying = state.get("underlying")
    if isinstance(underlying, dict):
        return f"{label}({format_state(underlying)})"
    if kind == "finished":
        return f"{label}({state.get('result_kind')})"
    return label


def format_time(ts: str | None) -> str:
    """ISO 8601 UTC with milliseconds: 2025-01-31T12:00:00.123Z."""
    if not ts:
        return "-"
    if ts.endswith("Z") and "." in ts:
        head, _, frac = ts[:-1].partition(".")
        return f"{head}.{frac[:3].ljust(3, '0')}Z"
    return ts


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _pretty(value: Any) -> str:
    text = _compact(value)
    if len(text) <= 80 and "\n" not in text:
        return text
    return json.dumps(value, ensure_ascii=False, indent=2)


def format_result(result: dict[str, Any]) -> str:
    """`ok: value`, `err: value`, `execution failure (kind): reason` + detail."""
    if "ok" in result:
        return "ok" if result["ok"] is None else f"ok: {_pretty(result['ok'])}"
    if "err" in result:
        return "err" if result["err"] is None else f"err: {_pretty(result['err'])}"
    failure = result.get("execution_failure")
    if isinstance(failure, dict):
        text = f"execution failure ({failure.get('kind')})"
        if failure.get("reason"):
            text += f": {failure['reason']}"
        detail = str(failure.get("detail") or "").rstrip()
        if detail:
            text += "\n" + "\n".join("  " + line for line in detail.splitlines())
        return text
    return _pretty(result)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: Values shown whole in event summaries (to copy them); reasons up to REASON_LIMIT.
WHOLE_KEYS = frozenset({"id", "digest"})
REASON_LIMIT = 500


def _summarize(obj: dict[str, Any], limit: int = 60) -> str:
    """`type key=value …` for one event or response. Ids stay whole (to copy them);
    other values longer than `limit` are cut (`--json` has them all)."""
    kind = str(obj.get("type", "?"))
    if kind == "finished" and isinstance(obj.get("result"), dict):
        r = dict(obj["result"])
        tag = r.pop("type", None)
        ok_err = tag in ("ok", "err")
        result = {str(tag): r.get("value")} if ok_err else {"execution_failure": r}
        return "finished " + _clip(format_result(result).splitlines()[0], 2 * limit)
    parts = [kind]
    for key, value in obj.items():
        if key == "type":
            continue
        if isinstance(value, dict) and "type" in value:
            parts.append(f"{key}=({_summarize(value, limit)})")
        elif isinstance(value, str) and (key in WHOLE_KEYS or key.endswith("_id")):
            parts.append(f"{key}={value}")
        elif isinstance(value, str) and key == "reason":  # why, often naming ids
            parts.append(f"{key}={_clip(value, REASON_LIMIT)}")
        else:
            text = value if isinstance(value, str) else _compact(value)
            parts.append(f"{key}={_clip(text, limit)}")
    return " ".join(parts)


#: `execution status` shows this much of a result (`execution result` shows it all).
STATUS_RESULT_LIMIT = 2_000


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = []
    for row in [headers, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2))


def _status_lines(info: ExecutionInfo) -> str:
    rows: list[tuple[str, str]] = [
        ("execution", info["execution_id"]),
        ("ffqn", info["ffqn"]),
        ("component", info["component_type"]),
        ("state", format_state(info["state"])),
    ]
    if info["scheduled_at"]:
        rows.append(("scheduled at", format_time(info["scheduled_at"])))
    if info["lock_expires_at"] and lock_held(info, datetime.now(UTC)):
        rows.append(("lock expires", format_time(info["lock_expires_at"])))
    if info["state"].get("type") == "finished":
        rows.append(("finished at", format_time(info["state"].get("finished_at"))))
    rows += [
        ("created at", format_time(info["created_at"])),
        ("updated at", format_time(info["updated_at"])),
        ("next version", str(info["next_version"])),
    ]
    if info["parent_id"]:
        rows.append(("parent", info["parent_id"]))
    if info["temporary_event_count"]:
        rows.append(("temporary failures", str(info["temporary_event_count"])))
    if info["result"] is not None:
        text = format_result(info["result"])
        if len(text) > STATUS_RESULT_LIMIT:
            text = (
                text[:STATUS_RESULT_LIMIT]
                + f"… ({len(text) - STATUS_RESULT_LIMIT:,} more characters: "
                f"`obelisk execution result {info['execution_id']}`)"
            )
        rows.append(("result", text))
    width = max(len(k) for k, _ in rows)
    out = []
    for key, value in rows:
        first, *rest = value.splitlines() or [""]
        out.append(f"{key.ljust(width)}  {first}")
        out += [" " * (width + 2) + line for line in rest]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> ApiClient:
    url = getattr(args, "api_url", None) or os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    problem = api_url_problem(url)
    if problem is not None:
        source = "--api-url" if getattr(args, "api_url", None) else API_URL_ENV
        raise UsageError(f"{source} {problem}")
    return ApiClient(url, os.environ.get(TOKEN_ENV) or None)


def _result_exit(result: dict[str, Any]) -> int:
    return 0 if "ok" in result else 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_json_arg(text: str, what: str) -> Any:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
        # Lone surrogates ("\ud800") parse, but cannot be sent.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except ValueError as e:  # UnicodeEncodeError included
        raise UsageError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:  # json gives up at the interpreter's recursion limit
        raise UsageError(f"{what} is nested too deeply (arrays/objects in one another)") from None
    return value


def cmd_server_run(args: argparse.Namespace) -> int:
    from engine.server.run import run_server

    return run_server(
        args.deployment,
        args.data_dir,
        args.api_listen,
        args.allow_unauthenticated_api,
        database_url=args.database_url,
        config=args.config,
        cpu_affinity=args.cpu_affinity,
        processes=args.processes,
    )


def cmd_server_verify(args: argparse.Namespace) -> int:
    """Check a deployment as `server run` would, without starting anything."""
    import asyncio
    import tempfile
    from pathlib import Path

    from engine.components import verify_deployment
    from engine.errors import DeploymentError

    async def verify(cache: Path) -> Any:
        return await verify_deployment(args.deployment, cache)

    try:
        if args.data_dir is not None:
            registry = asyncio.run(verify(Path(args.data_dir) / "cache"))
        else:
            with tempfile.TemporaryDirectory(prefix="obelisk-verify-") as tmp:
                registry = asyncio.run(verify(Path(tmp)))
    except DeploymentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    components = registry.components
    print(
        f"{args.deployment}: ok, {len(components)} component(s), "
        f"{len(registry.functions)} function(s)"
    )
    width = max((len(c.config.name) for c in components), default=0)
    for c in components:
        digest = c.component_id.digest
        print(
            f"  {c.config.type:<15}{c.config.name:<{width}}  {digest[:19]}…  "
            + ", ".join(f.rsplit("/", 1)[-1] for f in c.ffqns)
        )
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    params = _parse_json_arg(args.params, "PARAMS")
    if not isinstance(params, list):
        raise UsageError("PARAMS must be a JSON array, e.g. '[\"hello\", 42]'")
    client = _client(args)
    eid = client.submit(args.ffqn, params)
    if not args.follow:
        if args.json:
            _print_json({"execution_id": eid})
        else:
            print(eid)
        return 0
    if not args.json:
        print(eid, flush=True)
    result = client.result(eid, follow=True)
    if args.json:
        _print_json({"execution_id": eid, "result": result})
    else:
        print(format_result(result))
    return _result_exit(result)


def cmd_list(args: argparse.Namespace) -> int:
    rows = _client(args).list_executions(
        ffqn_prefix=args.ffqn,
        states=args.state or (),
        hide_finished=args.hide_finished,
        top_level_only=args.top_level_only,
        id_prefix=args.id_prefix,
        limit=args.limit,
        before=args.before,
    )
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        print("no executions")
        return 0
    print(
        _table(
            ("EXECUTION ID", "STATE", "CREATED", "FFQN"),
            [
                (
                    r["execution_id"],
                    format_state(r["state"]),
                    format_time(r["created_at"]),
                    r["ffqn"],
                )
                for r in rows
            ],
        )
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    info = _client(args).status(args.id)
    if args.json:
        _print_json(info)
    else:
        print(_status_lines(info))
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    result = _client(args).result(args.id, follow=args.follow, timeout=args.timeout)
    if args.json:
        _print_json(result)
    else:
        print(format_result(result))
    return _result_exit(result)


def cmd_events(args: argparse.Namespace) -> int:
    events: list[EventEntry] = _client(args).events(
        args.id, version=args.version, length=args.length
    )
    if args.json:
        _print_json(events)
        return 0
    if not events:  # every log has `created`: only a version past the end gives none
        print(f"no events from version {args.version or 0}")
        return 0
    print(
        _table(
            ("VERSION", "CREATED", "EVENT"),
            [
                (str(e["version"]), format_time(e["created_at"]), _summarize(e["event"]))
                for e in events
            ],
        )
    )
    return 0


def cmd_responses(args: argparse.Namespace) -> int:
    responses: list[ResponseEntry] = _client(args).responses(args.id)
    if args.json:
        _print_json(responses)
        return 0
    if not responses:
        print("no responses")
        return 0
    print(
        _table(
            ("CURSOR", "CREATED", "RESPONSE"),
            [
                (str(r["cursor"]), format_time(r["created_at"]), _summarize(r["response"]))
                for r in responses
            ],
        )
    )
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    lines: list[LogEntry] = _client(args).logs(args.id, limit=args.limit)
    if args.json:
        _print_json(lines)
        return 0
    if not lines:
        print("no log lines")
        return 0
    for line in lines:
        source = line["stream"] if line["stream"] != "log" else line["level"].upper()
        print(f"{format_time(line['created_at'])}  {source:<6}  {line['message']}")
    return 0


def _action(name: str) -> Callable[[argparse.Namespace], int]:
    past = {"pause": "paused", "unpause": "unpaused", "cancel": "cancellation requested for"}

    def run(args: argparse.Namespace) -> int:
        client = _client(args)
        force = getattr(args, "force", False)
        info: ExecutionInfo = (
            client.cancel(args.id, force=True) if force else getattr(client, name)(args.id)
        )
        if args.json:
            _print_json(info)
        else:
            verb = "forced " + past[name] if force else past[name]
            print(f"{verb} {info['execution_id']}: now {format_state(info['state'])}")
        return 0

    return run


def cmd_stub(args: argparse.Namespace) -> int:
    result = _parse_json_arg(args.result, "RESULT")
    if not (isinstance(result, dict) and len(result) == 1 and next(iter(result)) in ("ok", "err")):
        raise UsageError('RESULT must be {"ok": value} or {"err": value}')
    info = _client(args).stub(args.id, result)
    if args.json:
        _print_json(info)
    else:
        print(f"stubbed {info['execution_id']}: now {format_state(info['state'])}")
    return 0


def cmd_delay_cancel(args: argparse.Namespace) -> int:
    info = _client(args).cancel_delay(args.id)
    if args.json:
        _print_json(info)
    else:
        print(
            f"cancelled delay {args.id}: {info['execution_id']} now {format_state(info['state'])}"
        )
    return 0


def cmd_persist_backtraces(args: argparse.Namespace) -> int:
    answer = _client(args).persist_backtraces(args.id)
    if args.json:
        _print_json(answer)
    else:
        print(
            f"stored {answer['stored']} backtraces for {answer['execution_id']} "
            f"({answer['history_events']} history events replayed on "
            f"{answer['component_digest']})"
        )
    return 0


def reload_lines(reload: dict[str, Any]) -> str:
    """The last reload (or the start), for reading: outcome, changes, upgrades, pinned
    old versions and functions whose executions wait."""
    what = "started" if reload.get("trigger") == "start" else f"reloaded ({reload.get('trigger')})"
    out = [
        f"{what} at {format_time(reload.get('at'))}: " + ("ok" if reload.get("ok") else "FAILED")
    ]
    if not reload.get("ok"):
        error = str(reload.get("error") or "")
        out += ["  " + line for line in error.splitlines()]
        if not upgrades_unchecked(reload):
            out.append("  the previous deployment stays in force")
    for c in reload.get("changes") or []:
        digest = c.get("new_digest") or c.get("old_digest") or ""
        out.append(f"  {c.get('change')} {c.get('type')} {c.get('name')} {digest}".rstrip())
    for u in reload.get("upgrades") or []:
        line = f"  upgrade of {u.get('execution_id')}: {u.get('outcome')}"
        if u.get("reason"):
            line += f": {u['reason']}"
        if u.get("pinned_digest"):
            line += f" (stays on {u['pinned_digest']})"
        out.append(line)
    for p in reload.get("pinned") or []:
        runs = "running" if p.get("running") else "NOT RUNNING: its executions wait"
        out.append(f"  old version {p.get('digest')}: {p.get('executions')} execution(s), {runs}")
    for o in reload.get("orphaned") or []:
        out.append(
            f"  {o.get('executions')} execution(s) of {o.get('ffqn')} wait: "
            "this server's deployment does not export it"
        )
    return "\n".join(out)


def cmd_deployment_status(args: argparse.Namespace) -> int:
    info = _client(args).deployment()
    if args.json:
        _print_json(info)
    else:
        print(f"deployment {info['deployment_id']}")
        print(reload_lines(dict(info["reload"])))
    return 0 if info["reload"].get("ok") else 1


def cmd_components(args: argparse.Namespace) -> int:
    components: list[ComponentInfo] = _client(args).components()
    if args.json:
        _print_json(components)
        return 0
    if not components:
        print("no components")
        return 0
    width_type = max(len(c["type"]) for c in components)
    width_name = max(len(c["name"]) for c in components)
    for c in components:
        print(f"{c['type'].ljust(width_type)}  {c['name'].ljust(width_name)}  {c['digest']}")
        if c["location"]:
            print(f"    location: {c['location']}")
        for f in c["exports"]:
            params = ", ".join(f"{p['name']}: {p['type']}" for p in f["params"])
            ret = f" -> {f['return_type']}" if f["return_type"] else ""
            print(f"    {f['ffqn']}({params}){ret}")
    return 0


# ---------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--api-url",
        default=argparse.SUPPRESS,
        help=f"server address (env {API_URL_ENV}, default {DEFAULT_API_URL})",
    )
    json_flag = _Parser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON (for scripts)")

    parser = _Parser(
        prog="obelisk",
        description="Obelisk durable execution engine (Python). The API token is read "
        f"from {TOKEN_ENV}.",
    )
    parser.add_argument(
        "--api-url",
        default=None,
        help=f"server address (env {API_URL_ENV}, default {DEFAULT_API_URL})",
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    _add_server_commands(top)
    _add_execution_commands(top, [common, json_flag])
    _add_other_commands(top, [common, json_flag])
    return parser


def _add_server_commands(top: Any) -> None:
    """`obelisk server run|verify`."""
    server = top.add_parser("server", help="run the engine and its API")
    server_sub = server.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    run = server_sub.add_parser("run", help="run the engine and the REST API until stopped")
    run.add_argument("--deployment", required=True, metavar="FILE", help="deployment.toml")
    run.add_argument(
        "--data-dir", default="data", metavar="DIR", help="database and caches (default ./data)"
    )
    run.add_argument(
        "--api-listen",
        default="127.0.0.1:5005",
        metavar="HOST:PORT",
        help="API address (default 127.0.0.1:5005)",
    )
    run.add_argument(
        "--allow-unauthenticated-api",
        action="store_true",
        help=f"no bearer token (otherwise {TOKEN_ENV} or a generated one)",
    )
    run.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL shared by several servers: postgresql://user:password@"
        "host:port/dbname[?schema=NAME] (env OBELISK_DATABASE_URL; "
        "default: SQLite in the data dir)",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help="server config TOML ([database.postgres] host, port, user, "
        "password or password_env, dbname, schema)",
    )
    run.add_argument(
        "--cpu-affinity",
        choices=["split", "off"],
        default="split",
        help="split (default): the threads that take turns on the GIL on one "
        "CPU, the SQLite writer and activity runs on the others; off: "
        "leave placement to the OS",
    )
    run.add_argument(
        "--processes",
        type=parse_processes,
        default=1,
        metavar="N|auto",
        help="engine processes sharing the work (default 1; auto: one per CPU): one "
        "Python process computes on one CPU at a time, so more use more CPUs. With SQLite "
        "each keeps its executions in a file of its own (a shard), for good: the data dir "
        "is served by as many processes from then on",
    )
    run.set_defaults(handler=cmd_server_run)
    verify = server_sub.add_parser(
        "verify",
        help="check a deployment as `run` would (TOML, components, workflows' imports) "
        "and exit: 0 ok, 1 with the problem",
    )
    verify.add_argument("--deployment", required=True, metavar="FILE", help="deployment.toml")
    verify.add_argument(
        "--data-dir",
        metavar="DIR",
        help="reuse and fill the compiled-component cache of this data dir "
        "(default: a temporary one)",
    )
    verify.set_defaults(handler=cmd_server_verify)


def _add_execution_commands(top: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`obelisk execution …`: submit, list, status, result, events, responses, logs,
    pause, unpause, cancel, stub, persist-backtraces."""
    common, json_flag = parents
    execution = top.add_parser("execution", help="submit and inspect executions")
    ex = execution.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    p = ex.add_parser(
        "submit",
        parents=[common, json_flag],
        help="submit an execution",
        description="Submit a top-level execution. With --follow, wait and "
        "print the result; the exit status is then 1 unless it is ok.",
    )
    p.add_argument("ffqn", metavar="FFQN", help="e.g. myapp:demo/activity.step")
    p.add_argument(
        "params",
        metavar="PARAMS",
        nargs="?",
        default="[]",
        help="params as a JSON array (default [])",
    )
    p.add_argument("--follow", action="store_true", help="wait for the result and print it")
    p.set_defaults(handler=cmd_submit)

    p = ex.add_parser("list", parents=[common, json_flag], help="list executions, newest first")
    p.add_argument("--ffqn", metavar="PREFIX", help="only FFQNs starting with PREFIX")
    p.add_argument(
        "--state", action="append", choices=STATE_NAMES, help="only this state (repeatable)"
    )
    p.add_argument("--hide-finished", action="store_true", help="leave out finished ones")
    p.add_argument("--top-level-only", action="store_true", help="leave out children")
    p.add_argument("--id-prefix", metavar="PREFIX", help="only ids starting with PREFIX")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N (default 100)")
    p.add_argument("--before", metavar="ID", help="page: executions created before ID")
    p.set_defaults(handler=cmd_list)

    p = ex.add_parser("status", parents=[common, json_flag], help="state of an execution")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_status)

    p = ex.add_parser(
        "result",
        parents=[common, json_flag],
        help="result of an execution",
        description="Print the result (exit status 1 unless it is ok).",
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--follow", action="store_true", help="wait until it finishes")
    p.add_argument(
        "--timeout", type=_seconds, metavar="SECONDS", help="with --follow: give up after SECONDS"
    )
    p.set_defaults(handler=cmd_result)

    p = ex.add_parser("events", parents=[common, json_flag], help="the execution log")
    p.add_argument("id", metavar="ID")
    p.add_argument("--version", type=_non_negative_int, metavar="V", help="from version V")
    p.add_argument("--length", type=_positive_int, metavar="N", help="at most N events")
    p.set_defaults(handler=cmd_events)

    p = ex.add_parser(
        "responses", parents=[common, json_flag], help="responses received (children, delays)"
    )
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_responses)

    p = ex.add_parser("logs", parents=[common, json_flag], help="log lines of an execution")
    p.add_argument("id", metavar="ID")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N lines")
    p.set_defaults(handler=cmd_logs)

    for name, text in (
        ("pause", "pause an execution"),
        ("unpause", "unpause an execution"),
        ("cancel", "cancel an activity or a -cancellable workflow (--force: any workflow)"),
    ):
        p = ex.add_parser(name, parents=[common, json_flag], help=text)
        p.add_argument("id", metavar="ID")
        if name == "cancel":
            p.add_argument(
                "--force",
                action="store_true",
                help="end a workflow that is not -cancellable anyway (e.g. stuck in an "
                "endless loop): its run is interrupted, its children are cancelled, it "
                "finishes cancelled; recorded in its log as forced",
            )
        p.set_defaults(handler=_action(name))

    p = ex.add_parser(
        "stub", parents=[common, json_flag], help="write the result of an activity_stub execution"
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("result", metavar="RESULT", help='{"ok": value} or {"err": value}')
    p.set_defaults(handler=cmd_stub)

    p = ex.add_parser(
        "persist-backtraces",
        parents=[common, json_flag],
        help="replay a JS workflow and store its backtraces",
        description="Replay the execution against its deployed code (no "
        "history is written) and store the JS stack of every history event.",
    )
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_persist_backtraces)


def _add_other_commands(top: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`obelisk delay cancel`, `obelisk component list`, `obelisk deployment status`."""
    common, json_flag = parents
    delay = top.add_parser("delay", help="delays (timers) of workflows")
    delay_sub = delay.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    p = delay_sub.add_parser(
        "cancel",
        parents=[common, json_flag],
        help="cancel a delay: its workflow gets delay_finished(cancelled)",
    )
    p.add_argument("id", metavar="ID", help="Delay_<ULID>.<join set>_<n>")
    p.set_defaults(handler=cmd_delay_cancel)

    # component
    component = top.add_parser("component", help="deployed components")
    comp = component.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    p = comp.add_parser(
        "list", parents=[common, json_flag], help="components and their exported functions"
    )
    p.set_defaults(handler=cmd_components)

    # deployment
    deployment = top.add_parser("deployment", help="the deployment in force and its reloads")
    dep = deployment.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    p = dep.add_parser(
        "status",
        parents=[common, json_flag],
        help="the last reload: ok or the error, changes, upgrades, pinned old versions, "
        "functions whose executions wait (exit 1 when it failed)",
    )
    p.set_defaults(handler=cmd_deployment_status)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def _api_error_line(e: ApiError) -> str:
    if isinstance(e, ServerUnreachable):
        hint = "is `obelisk server run` running?"
        if e.reason == "connection refused":
            return f"cannot reach the obelisk server at {e.base_url}: {hint}"
        return f"cannot reach the obelisk server at {e.base_url} ({e.reason}): {hint}"
    if e.status == 401:
        if os.environ.get(TOKEN_ENV):
            return f"{e.message} (check {TOKEN_ENV}: the server printed its token at start)"
        return f"{e.message} (set {TOKEN_ENV} to the token `obelisk server run` printed)"
    return e.message


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        words = [w for w in (args.command, getattr(args, "action", None)) if w]
        prog = " ".join(["obelisk", *words])
        print(f"error: missing command (see `{prog} --help`)", file=sys.stderr)
        return 2
    try:
        return handler(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ApiError as e:
        print(f"error: {_api_error_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `obelisk … | head`
        sys.stderr.close()
        return 0


__all__ = ["build_parser", "format_result", "format_state", "format_time", "main"]


if __name__ == "__main__":
    sys.exit(main())
