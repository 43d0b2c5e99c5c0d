"""deployment.toml: every mistake is a clear error naming file, section and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.deployment import load_deployment
from engine.errors import DeploymentError


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "greet.js").write_text("export default function greet(n) { return n; }\n")
    p = tmp_path / "deployment.toml"
    p.write_text(text)
    return p


GOOD = """
[[activity_js]]
name = "greet"
location = "greet.js"
ffqn = "myapp:demo/greeter.greet"
params = [{ name = "name", type = "string" }]
return_type = "result<string, string>"
max_retries = 2
retry_exp_backoff.milliseconds = 50
exec.lock_expiry.seconds = 2
exec.batch_size = 3
env_vars = ["FROM_ENV", { key = "MODE", value = "test" }, "MISSING"]
allowed_host = ["api.example.com", { pattern = "*.example.org" }]

[[activity_stub]]
ffqn = "myapp:demo/approval.approve"
params = []
return_type = "result<bool, string>"
"""


def test_good_deployment_is_parsed(tmp_path: Path) -> None:
    d = load_deployment(write(tmp_path, GOOD), environ={"FROM_ENV": "x"})
    js, stub = d.components
    assert js.type == "activity_js" and js.name == "greet"
    assert js.location == (tmp_path / "greet.js").resolve()
    assert js.ffqn == "myapp:demo/greeter.greet"
    assert [p.name for p in js.params] == ["name"]
    assert js.max_retries == 2 and js.retry_exp_backoff_ms == 50
    assert js.exec.lock_expiry_ms == 2000 and js.exec.batch_size == 3
    assert js.env_vars == {"FROM_ENV": "x", "MODE": "test"}
    assert js.allowed_hosts == ("api.example.com", "*.example.org")
    assert stub.type == "activity_stub" and stub.name == "myapp:demo/approval.approve"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("[[activity_js]\nname=", ["malformed TOML"]),
        ("[[nonsense]]\nname = 'x'", ["unknown section `nonsense`"]),
        (
            GOOD.replace("max_retries = 2", "max_retries = 2\ncolour = 'red'"),
            ['[[activity_js]] #1 "greet"', "key `colour`", "unknown key"],
        ),
        (
            GOOD.replace('location = "greet.js"', 'location = "nope.js"'),
            ["key `location`", "file not found", "nope.js"],
        ),
        (
            GOOD.replace('"result<string, string>"', '"result<string, strin>"', 1),
            ["key `return_type`", "invalid type"],
        ),
        (
            GOOD.replace('"result<string, string>"', '"string"', 1),
            ["key `return_type`", "must be a result"],
        ),
        (GOOD.replace('type = "string"', 'type = "lizt<u8>"'), ["key `params[0].type`"]),
        (
            GOOD.replace('ffqn = "myapp:demo/greeter.greet"', 'ffqn = "greet"'),
            ["key `ffqn`", "namespace:package/interface.function"],
        ),
        (GOOD.replace("max_retries = 2", "max_retries = -1"), ["key `max_retries`"]),
        (
            GOOD.replace("retry_exp_backoff.milliseconds = 50", "retry_exp_backoff.fortnights = 1"),
            ["key `retry_exp_backoff.fortnights`"],
        ),
        (GOOD.replace("exec.batch_size = 3", "exec.batch_size = 0"), ["key `exec.batch_size`"]),
        (GOOD.replace("exec.batch_size = 3", "exec.turbo = true"), ["key `exec.turbo`"]),
        (
            GOOD.replace("exec.batch_size = 3", "exec.tick_sleep.milliseconds = 0"),
            ["key `exec.tick_sleep`", "must be positive"],
        ),
        (GOOD.replace('{ key = "MODE", value = "test" }', "42"), ["key `env_vars[1]`"]),
        (GOOD + GOOD.split("[[activity_stub]]")[0], ["duplicate name `greet`"]),
    ],
)
def test_bad_deployment_names_the_problem(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(DeploymentError) as info:
        load_deployment(path, environ={})
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_missing_deployment_file(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match="deployment file not found"):
        load_deployment(tmp_path / "absent.toml")
