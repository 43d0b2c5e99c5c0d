"""The `obelisk` CLI: in-process against a server on a background thread, and
`obelisk server run` as a real process (token printing, signals, start-up errors)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from engine.cli import main
from engine.client import ApiClient, ApiError
from engine.server.run import RunningServer, start_server
from tests.server.test_api import (
    APPROVE,
    CHECKOUT,
    COUNT,
    TOKEN,
    write_deployment,
    write_workflow_deployment,
)

# ---------------------------------------------------------------------------------------
# A server on a background thread
# ---------------------------------------------------------------------------------------


class ServerThread:
    def __init__(self, deployment: Path, data_dir: Path, token: str | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: RunningServer = self._call(
            start_server(deployment, data_dir, "127.0.0.1", 0, token)
        )
        self.url = self.server.url

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=20)

    def stop(self) -> None:
        try:
            self._call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    directory = tmp_path_factory.mktemp("cli")
    s = ServerThread(write_workflow_deployment(directory), directory / "data", TOKEN)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def api(server: ServerThread) -> ApiClient:
    return ApiClient(server.url, TOKEN)


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, err
        assert err == ""
        return out

    def fails(self, code: int, *argv: str) -> str:
        got, out, err = self(*argv)
        assert got == code, (out, err)
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("error: ")
        assert "Traceback" not in err
        return lines[0]


@pytest.fixture
def cli(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Cli:
    monkeypatch.setenv("OBELISK_API_TOKEN", TOKEN)
    monkeypatch.setenv("OBELISK_API_URL", server.url)
    return Cli(capsys)


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------


def test_component_list(cli: Cli) -> None:
    out = cli.ok("component", "list")
    assert "activity_stub" in out
    assert f"    {COUNT}(n: u32, tags: list<string>) -> result<u32, string>" in out
    data = json.loads(cli.ok("component", "list", "--json"))
    assert {c["name"] for c in data} == {APPROVE, "counter", "checkout"}
    assert "workflow_js" in out


def test_submit_status_result_human(cli: Cli, api: ApiClient) -> None:
    eid = cli.ok("execution", "submit", APPROVE, '["order-1"]').strip()
    assert eid.startswith("E_") and len(eid) == 28

    out = cli.ok("execution", "status", eid)
    assert f"execution     {eid}" in out
    assert "state         PendingAt" in out
    assert f"ffqn          {APPROVE}" in out

    line = cli.fails(1, "execution", "result", eid)
    assert line == f"error: execution {eid} is not finished yet (state: pending_at)"

    api.stub(eid, {"ok": True})
    assert cli.ok("execution", "result", eid) == "ok: true\n"
    assert "Finished(ok)" in cli.ok("execution", "status", eid)
    assert "result        ok: true" in cli.ok("execution", "status", eid)


def test_submit_and_status_json(cli: Cli, api: ApiClient) -> None:
    answer = json.loads(cli.ok("execution", "submit", COUNT, '[3, ["a"]]', "--json"))
    eid = answer["execution_id"]
    status = json.loads(cli.ok("execution", "status", eid, "--json"))
    assert status["state"]["type"] == "pending_at"
    assert status["ffqn"] == COUNT
    api.stub(eid, {"err": "too many"})
    code, out, err = cli("execution", "result", eid, "--json")
    assert (code, json.loads(out), err) == (1, {"err": "too many"}, "")
    code, out, _ = cli("execution", "result", eid)
    assert (code, out) == (1, 'err: "too many"\n')


def test_submit_follow(cli: Cli, api: ApiClient) -> None:
    before = {r["execution_id"] for r in api.list_executions(ffqn_prefix=APPROVE, limit=1000)}

    def stub_the_new_one() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = api.list_executions(ffqn_prefix=APPROVE, hide_finished=True, limit=1000)
            new = [r for r in rows if r["execution_id"] not in before]
            if new:
                time.sleep(0.2)  # let the CLI start waiting
                api.stub(new[0]["execution_id"], {"ok": False})
                return
            time.sleep(0.05)

    helper = threading.Thread(target=stub_the_new_one)
    helper.start()
    out = cli.ok("execution", "submit", APPROVE, '["o-f"]', "--follow")
    helper.join()
    eid, result = out.splitlines()
    assert eid.startswith("E_") and eid not in before
    assert result == "ok: false"

    code, out, _ = cli("execution", "result", eid, "--follow", "--json")
    assert (code, json.loads(out)) == (0, {"ok": False})


def test_result_follow_timeout(cli: Cli, api: ApiClient) -> None:
    eid = api.submit(APPROVE, ["slow"])
    line = cli.fails(1, "execution", "result", eid, "--follow", "--timeout", "0.1")
    assert "did not finish within 0.1 s" in line


def test_list(cli: Cli, api: ApiClient) -> None:
    eid = api.submit(COUNT, [7, []])
    api.pause(eid)
    out = cli.ok("execution", "list", "--ffqn", COUNT)
    header, *rows = out.splitlines()
    assert header.split() == ["EXECUTION", "ID", "STATE", "CREATED", "FFQN"]
    assert rows[0].split()[:2] == [eid, "Paused(PendingAt)"]
    assert rows[0].split()[3] == COUNT
    # Columns are aligned: every row's FFQN starts where the header's does.
    assert all(r.index(COUNT) == header.index("FFQN") for r in rows)

    data = json.loads(cli.ok("execution", "list", "--ffqn", COUNT, "--limit", "1", "--json"))
    assert [r["execution_id"] for r in data] == [eid]
    hidden = json.loads(cli.ok("execution", "list", "--hide-finished", "--json"))
    assert all(r["state"]["type"] != "finished" for r in hidden)
    paused = json.loads(cli.ok("execution", "list", "--state", "paused", "--json"))
    assert eid in [r["execution_id"] for r in paused]
    assert cli.ok("execution", "list", "--ffqn", "nothing:here/x.y") == "no executions\n"


def test_pause_unpause_cancel_stub(cli: Cli) -> None:
    eid = cli.ok("execution", "submit", APPROVE, '["o-p"]').strip()
    assert cli.ok("execution", "pause", eid) == f"paused {eid}: now Paused(PendingAt)\n"
    line = cli.fails(1, "execution", "pause", eid)
    assert line == f"error: execution {eid} is already paused"
    assert cli.ok("execution", "unpause", eid) == f"unpaused {eid}: now PendingAt\n"
    assert cli.fails(1, "execution", "unpause", eid).endswith("is not paused")
    assert cli.ok("execution", "stub", eid, '{"ok": true}') == f"stubbed {eid}: now Finished(ok)\n"
    assert "already finished" in cli.fails(1, "execution", "pause", eid)
    assert "another result" in cli.fails(1, "execution", "stub", eid, '{"err": "no"}')

    other = cli.ok("execution", "submit", APPROVE, '["o-c"]').strip()
    out = cli.ok("execution", "cancel", other)
    assert out == f"cancellation requested for {other}: now Finished(execution_failure:cancelled)\n"
    code, out, _ = cli("execution", "result", other)
    assert code == 1
    assert out.startswith("execution failure (cancelled)")
    info = json.loads(
        cli.ok(
            "execution",
            "pause",
            cli.ok("execution", "submit", APPROVE, '["o-j"]').strip(),
            "--json",
        )
    )
    assert info["state"]["type"] == "paused"


def test_events_responses_logs(cli: Cli, api: ApiClient) -> None:
    eid = api.submit(APPROVE, ["o-e"])
    api.pause(eid)
    api.stub(eid, {"ok": True})
    out = cli.ok("execution", "events", eid)
    header, *rows = out.splitlines()
    assert header.split() == ["VERSION", "CREATED", "EVENT"]
    assert [r.split()[0] for r in rows] == ["0", "1", "2"]
    assert rows[0].split()[2:4] == ["created", f"ffqn={APPROVE}"]
    assert rows[1].split()[2] == "paused"
    assert rows[2].split()[2:] == ["finished", "ok:", "true"]
    events = json.loads(cli.ok("execution", "events", eid, "--json", "--version", "1"))
    assert [e["event"]["type"] for e in events] == ["paused", "finished"]
    assert cli.ok("execution", "events", eid, "--version", "99") == "no events from version 99\n"

    assert cli.ok("execution", "responses", eid) == "no responses\n"
    assert json.loads(cli.ok("execution", "responses", eid, "--json")) == []
    assert cli.ok("execution", "logs", eid) == "no log lines\n"
    assert json.loads(cli.ok("execution", "logs", eid, "--json")) == []


def test_logs_human(cli: Cli, api: ApiClient, server: ServerThread) -> None:
    from engine.core.records import LogLine

    eid = api.submit(APPROVE, ["o-l"])
    engine = server.server.engine
    lines = [LogLine("info", "hello", "stdout"), LogLine("warn", "careful")]
    server._call(engine.storage.append_logs(eid, None, lines, engine.clock.now()))
    out = cli.ok("execution", "logs", eid).splitlines()
    assert out[0].endswith("Z  stdout  hello")
    assert out[1].endswith("Z  WARN    careful")


def test_workflow_child_status_responses_and_cancel(cli: Cli, api: ApiClient) -> None:
    eid = cli.ok("execution", "submit", CHECKOUT, '["order-9"]').strip()
    child = f"{eid}.o:1-approve_1"
    deadline = time.monotonic() + 10
    while True:
        try:
            api.status(child)
            break
        except ApiError:
            assert time.monotonic() < deadline, "the workflow never submitted its child"
            time.sleep(0.02)
    out = cli.ok("execution", "status", child)
    assert f"execution     {child}" in out
    assert f"parent        {eid}" in out

    line = cli.fails(1, "execution", "cancel", eid)
    assert line.startswith(f"error: execution {eid} ({CHECKOUT}) is not cancellable")

    assert cli.ok("execution", "stub", child, '{"ok": false}').startswith(f"stubbed {child}")
    code, out, _ = cli("execution", "result", eid, "--follow", "--timeout", "10")
    assert (code, out) == (0, 'ok: "rejected"\n')
    header, row = cli.ok("execution", "responses", eid).splitlines()
    assert header.split() == ["CURSOR", "CREATED", "RESPONSE"]
    assert row.split()[0] == "1"
    assert row.split()[2:4] == ["child_execution_finished", f"child_execution_id={child}"]
    rows = json.loads(cli.ok("execution", "list", "--top-level-only", "--json"))
    assert all(r["parent_id"] is None for r in rows)


def execution_info(**fields: Any) -> Any:
    """An `ExecutionInfo` as the API returns it, with `fields` changed."""
    info: dict[str, Any] = {
        "execution_id": "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC",
        "ffqn": "myapp:demo/activity.big",
        "component_type": "activity_js",
        "state": {"type": "pending_at"},
        "scheduled_at": None,
        "lock_expires_at": None,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "next_version": 3,
        "parent_id": None,
        "temporary_event_count": 0,
        "result": None,
    }
    return info | fields


def test_deployment_status(cli: Cli) -> None:
    out = cli.ok("deployment", "status")
    first, second = out.splitlines()[:2]
    assert first.startswith("deployment Dep_")
    assert second.startswith("started at ") and second.endswith(": ok")
    info = json.loads(cli.ok("deployment", "status", "--json"))
    assert info["reload"]["trigger"] == "start" and info["reload"]["ok"] is True
    assert info["reload"]["orphaned"] == [] and info["reload"]["pinned"] == []


def test_reload_lines_say_what_waits() -> None:
    from engine.cli import reload_lines

    text = reload_lines(
        {
            "trigger": "watch",
            "at": "2026-01-01T00:00:00Z",
            "ok": True,
            "changes": [
                {
                    "change": "changed",
                    "type": "workflow_js",
                    "name": "order",
                    "new_digest": "sha256:2",
                }
            ],
            "upgrades": [
                {
                    "execution_id": "E_1",
                    "outcome": "failed",
                    "reason": "at version 3 the log has …",
                    "pinned_digest": "sha256:1",
                }
            ],
            "pinned": [{"digest": "sha256:1", "executions": 1, "running": False}],
            "orphaned": [{"ffqn": "a:b/c.d", "executions": 2}],
        }
    )
    assert "changed workflow_js order sha256:2" in text
    assert "upgrade of E_1: failed: at version 3 the log has … (stays on sha256:1)" in text
    assert "old version sha256:1: 1 execution(s), NOT RUNNING: its executions wait" in text
    assert "2 execution(s) of a:b/c.d wait: this server's deployment does not export it" in text
    failed = reload_lines({"trigger": "watch", "at": None, "ok": False, "error": "bad\nTOML"})
    assert "FAILED" in failed and "  bad\n  TOML" in failed and "previous deployment" in failed
    in_force = "the deployment is in force, but its workflow upgrades failed: database down"
    text = reload_lines({"trigger": "watch", "at": None, "ok": False, "error": in_force})
    assert in_force in text and "previous deployment" not in text


def test_status_shows_a_blocked_workflows_lock_only_while_held() -> None:
    from engine.cli import _status_lines

    info = execution_info(
        ffqn="myapp:demo/workflow.order",
        component_type="workflow_js",
        state={"type": "blocked_by_join_set", "join_set_id": "o:1-approve"},
        lock_expires_at="2026-01-01T00:00:00Z",  # long past: no run holds it
    )
    assert "lock expires" not in _status_lines(info)
    info["lock_expires_at"] = "2999-01-01T00:00:00Z"
    assert "lock expires" in _status_lines(info)
    info["state"] = {"type": "locked"}  # an expired lock of a locked one says so
    info["lock_expires_at"] = "2026-01-01T00:00:00Z"
    assert "lock expires" in _status_lines(info)


def test_event_summaries_keep_ids_whole_and_cut_long_values() -> None:
    from engine.cli import _summarize

    child = "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC.g:batch-with-a-long-name_1.o:1-approve-every-order_42"
    event = {
        "type": "history_event",
        "event": {
            "type": "join_set_request",
            "join_set_id": "g:batch-with-a-long-name_1",
            "request": {
                "type": "child_execution",
                "child_execution_id": child,
                "target_ffqn": "myapp:demo/activity.approve",
                "params": ["x" * 500],
            },
        },
    }
    text = _summarize(event)
    assert f"child_execution_id={child}" in text
    reason = f"at version 3 the log has submit(o:1-approve, {child}, …), but …" + "x" * 80
    upgrade = {
        "type": "component_upgrade_finished",
        "digest": "sha256:" + "4" * 64,
        "outcome": {"type": "failed", "reason": reason},
    }
    summary = _summarize(upgrade)
    assert "sha256:" + "4" * 64 in summary and reason in summary  # why an upgrade failed
    assert 'params=["xxx' in text and "x" * 100 not in text and "…" in text


def test_status_shows_the_start_of_a_huge_result() -> None:
    from engine.cli import STATUS_RESULT_LIMIT, _status_lines

    info = execution_info(
        state={"type": "finished", "finished_at": "2026-01-01T00:00:00Z"},
        result={"ok": "y" * 100_000},
    )
    text = _status_lines(info)
    assert len(text) < STATUS_RESULT_LIMIT + 1_000
    assert "more characters: `obelisk execution result E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC`" in text


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def test_server_side_errors(cli: Cli) -> None:
    assert cli.fails(1, "execution", "submit", "myapp:demo/x.y", "[]") == (
        "error: function myapp:demo/x.y is not exported by any deployed component"
    )
    assert cli.fails(1, "execution", "submit", "notanffqn", "[]") == (
        "error: 'notanffqn' is not an FFQN (namespace:package/interface.function, "
        "e.g. myapp:demo/activity.step)"
    )
    line = cli.fails(1, "execution", "submit", APPROVE, "[1]")
    assert "params[0] (order)" in line
    assert "takes 1 parameter" in cli.fails(1, "execution", "submit", APPROVE)
    assert "invalid execution id" in cli.fails(1, "execution", "status", "E_nope")
    missing = "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"
    assert cli.fails(1, "execution", "status", missing) == f"error: execution {missing} not found"


def test_usage_errors(cli: Cli) -> None:
    line = cli.fails(2, "execution", "submit", APPROVE, "[1")
    assert line.startswith("error: PARAMS is not valid JSON")
    assert "must be a JSON array" in cli.fails(2, "execution", "submit", APPROVE, '{"a": 1}')
    assert "RESULT must be" in cli.fails(2, "execution", "stub", "E_x", '{"maybe": 1}')
    assert "RESULT is not valid JSON" in cli.fails(2, "execution", "stub", "E_x", "ok")
    assert "NaN is not a JSON number" in cli.fails(2, "execution", "submit", APPROVE, "[NaN]")
    assert "surrogates not allowed" in cli.fails(2, "execution", "submit", APPROVE, '["\\ud800"]')
    assert "--api-url 'localhost:5005' is not an http(s) URL" in cli.fails(
        2, "--api-url", "localhost:5005", "execution", "list"
    )
    assert "invalid choice" in cli.fails(2, "execution", "frobnicate")
    assert "--limit" in cli.fails(2, "execution", "list", "--limit", "0")
    assert "missing command" in cli.fails(2)
    assert "missing command" in cli.fails(2, "execution")
    assert "required" in cli.fails(2, "server", "run")
    assert "invalid choice: 'both'" in cli.fails(
        2, "server", "run", "--deployment", "d.toml", "--cpu-affinity", "both"
    )
    assert "--processes: must be from 1 to 64, not 0" in cli.fails(
        2, "server", "run", "--deployment", "d.toml", "--processes", "0"
    )
    assert "--processes: not a number or auto: 'many'" in cli.fails(
        2, "server", "run", "--deployment", "d.toml", "--processes", "many"
    )


def test_help(cli: Cli) -> None:
    code, out, _ = cli("--help")
    assert code == 0 and "execution" in out
    code, out, _ = cli("execution", "submit", "--help")
    assert code == 0 and "--follow" in out


def test_wrong_or_missing_token(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OBELISK_API_TOKEN", "wrong")
    line = cli.fails(1, "execution", "list")
    assert line.startswith("error: invalid bearer token")
    monkeypatch.delenv("OBELISK_API_TOKEN")
    line = cli.fails(1, "component", "list")
    assert line.startswith("error: missing bearer token")
    assert "OBELISK_API_TOKEN" in line


def test_connection_refused(cli: Cli) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    expected = f"error: cannot reach the obelisk server at {url}: is `obelisk server run` running?"
    assert cli.fails(1, "--api-url", url, "execution", "list") == expected
    assert cli.fails(1, "execution", "status", "E_x", "--api-url", url) == expected
    with pytest.raises(ApiError) as info:
        ApiClient(url, TOKEN).components()
    assert info.value.status is None


def test_api_url_option_wins_over_environment(
    cli: Cli, server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OBELISK_API_URL", f"http://127.0.0.1:{_free_port()}")
    assert cli.ok("--api-url", server.url, "component", "list")
    assert cli.ok("component", "list", "--api-url", server.url)


# ---------------------------------------------------------------------------------------
# `obelisk server run` as a process
# ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _obelisk() -> list[str]:
    script = Path(sys.executable).with_name("obelisk")
    return [str(script)] if script.exists() else [sys.executable, "-m", "engine.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBELISK_")}
    env.update(extra)
    return env


class ServerProcess:
    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [*_obelisk(), "server", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.errors: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._err_pump = threading.Thread(target=self._pump_stderr, daemon=True)
        self._err_pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.errors += self.proc.stderr

    def wait_for(self, prefix: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} in {self.output}") from None
            if line is None:
                raise AssertionError(f"server exited; output: {self.output}")
            self.output.append(line)
            if line.startswith(prefix):
                return line

    def finish(self, sig: int) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._err_pump.join(timeout=5)
        err = "".join(self.errors)
        rest: list[str] = []
        while True:
            line = self.lines.get(timeout=5)
            if line is None:
                break
            rest.append(line)
        self.output += rest
        return self.proc.returncode, "\n".join(self.output), err


def test_server_run_generates_and_prints_token(tmp_path: Path) -> None:
    deployment = write_deployment(tmp_path)
    port = _free_port()
    server = ServerProcess(
        ["--deployment", str(deployment), "--api-listen", f"127.0.0.1:{port}"],
        _env(),
        tmp_path,
    )
    try:
        token_line = server.wait_for("API token (generated): ")
        token = token_line.removeprefix("API token (generated): ")
        hint = server.wait_for("  clients: export ")
        assert hint == f"  clients: export OBELISK_API_TOKEN={token}"
        server.wait_for(f"API listening on http://127.0.0.1:{port}")
    except BaseException:
        server.proc.kill()
        raise
    cpus = os.sched_getaffinity(0)
    if len(cpus) >= 2:  # --cpu-affinity split by default: the loop's thread on one CPU
        assert os.sched_getaffinity(server.proc.pid) == {min(cpus)}
    url = f"http://127.0.0.1:{port}"
    assert len(token) >= 32
    assert [c["name"] for c in ApiClient(url, token).components()]
    with pytest.raises(ApiError) as info:
        ApiClient(url, None).components()
    assert info.value.status == 401
    code, out, err = server.finish(signal.SIGINT)
    assert code == 0, err
    assert "Loaded 2 component(s):" in out
    assert out.endswith("Stopped.")
    assert "Traceback" not in err
    assert (tmp_path / "data" / "obelisk.sqlite").exists(), "default data dir is ./data"


def test_server_run_token_from_environment_and_sigterm(tmp_path: Path) -> None:
    deployment = write_deployment(tmp_path)
    port = _free_port()
    server = ServerProcess(
        [
            "--deployment",
            str(deployment),
            "--data-dir",
            str(tmp_path / "d"),
            "--api-listen",
            f"127.0.0.1:{port}",
        ],
        _env(OBELISK_API_TOKEN="from-env-token"),
        tmp_path,
    )
    try:
        server.wait_for("API listening on")
    except BaseException:
        server.proc.kill()
        raise
    url = f"http://127.0.0.1:{port}"
    eid = ApiClient(url, "from-env-token").submit(APPROVE, ["x"])
    code, out, err = server.finish(signal.SIGTERM)
    assert code == 0, err
    assert "API token: taken from OBELISK_API_TOKEN" in out
    assert "from-env-token" not in out
    assert "Stopped." in out
    assert (tmp_path / "d" / "obelisk.sqlite").exists()
    assert eid


def _run_fails(args: list[str], cwd: Path, code: int = 1) -> str:
    proc = subprocess.run(
        [*_obelisk(), "server", "run", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=60,
    )
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    if "deployment" in proc.stderr:  # told before a token is printed or a port taken
        assert "API token" not in proc.stdout, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_server_run_port_in_use(tmp_path: Path) -> None:
    deployment = write_deployment(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = _run_fails(
            ["--deployment", str(deployment), "--api-listen", f"127.0.0.1:{port}"], tmp_path
        )
    assert line == f"error: cannot listen on http://127.0.0.1:{port}: address already in use"
    # Refused before the engine started: no database was opened, nothing ran.
    assert list(tmp_path.rglob("obelisk.sqlite")) == []


@pytest.mark.parametrize(
    ("case", "code", "fragment"),
    [
        ("missing deployment", 1, "nope.toml: deployment file not found"),
        ("malformed deployment", 1, "malformed TOML"),
        ("data dir not writable", 1, "cannot use the data directory"),
        ("data dir is a file", 1, "afile: Not a directory"),
        ("bad --api-listen", 2, "--api-listen"),
    ],
)
def test_server_run_start_up_errors(tmp_path: Path, case: str, code: int, fragment: str) -> None:
    deployment = write_deployment(tmp_path)
    args = ["--deployment", str(deployment)]
    if case == "missing deployment":
        args = ["--deployment", str(tmp_path / "nope.toml")]
    elif case == "malformed deployment":
        deployment.write_text("[[activity_stub]\n")
    elif case == "data dir not writable":
        blocker = tmp_path / "blocker"  # a file where the data dir's parent should be
        blocker.write_text("")
        args += ["--data-dir", str(blocker / "data")]
    elif case == "data dir is a file":
        (tmp_path / "afile").write_text("")
        args += ["--data-dir", str(tmp_path / "afile")]
    # A free port (the default one may be taken on this machine), except for the case
    # about the address itself.
    args += ["--api-listen", "localhost" if case == "bad --api-listen" else "127.0.0.1:0"]
    assert fragment in _run_fails(args, tmp_path, code)


def test_server_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`server verify` checks what `server run` checks at start, and starts nothing."""
    deployment = write_workflow_deployment(tmp_path)
    cli = Cli(capsys)
    code, out, err = cli("server", "verify", "--deployment", str(deployment))
    assert code == 0, err
    assert out.startswith(f"{deployment}: ok, ") and "checkout" in out
    assert list(tmp_path.rglob("obelisk.sqlite*")) == []  # no database, no data dir
    # A workflow importing a function the deployment does not export.
    (tmp_path / "checkout.js").write_text(
        (tmp_path / "checkout.js").read_text().replace("approval", "approvals", 1)
    )
    code, out, err = cli("server", "verify", "--deployment", str(deployment), "--data-dir",
                         str(tmp_path / "data"))  # fmt: skip
    assert code == 1 and out == ""
    assert err.startswith(f"error: {deployment}: [[workflow_js]]") and "approvals" in err, err
    assert "Traceback" not in err
    assert (tmp_path / "data" / "cache").is_dir()  # the cache of that data dir was used
    code, _, err = cli("server", "verify", "--deployment", str(tmp_path / "nope.toml"))
    assert (code, err.strip()) == (1, f"error: {tmp_path / 'nope.toml'}: deployment file not found")
