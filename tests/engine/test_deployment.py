"""deployment.toml: every mistake is a clear error naming file, section and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.deployment import load_deployment
from engine.errors import DeploymentError
from tests.fixtures.deployments import Deployment, ms, seconds


def write(tmp_path: Path, text: str | Deployment) -> Path:
    (tmp_path / "greet.js").write_text("export default function greet(n) { return n; }\n")
    if isinstance(text, Deployment):
        return text.write(tmp_path)
    p = tmp_path / "deployment.toml"
    p.write_text(text)
    return p


def greet(**changes: Any) -> Deployment:
    """The `[[activity_js]]` of GOOD, with `changes` to its keys (greet.js: `write`)."""
    keys: dict[str, Any] = {
        "location": "greet.js",
        "ffqn": "myapp:demo/greeter.greet",
        "params": [("name", "string")],
        "return_type": "result<string, string>",
        "max_retries": 2,
        "retry_exp_backoff": ms(50),
        "exec": {"lock_expiry": seconds(2), "batch_size": 3},
        "env_vars": ["FROM_ENV", {"key": "MODE", "value": "test"}, "MISSING"],
        "allowed_host": ["api.example.com", {"pattern": "*.example.org"}],
    }
    return Deployment().activity_js("greet", None, **{**keys, **changes})


STUB = Deployment().activity_stub(
    "myapp:demo/approval.approve", params=[], return_type="result<bool, string>"
)


def good(**changes: Any) -> Deployment:
    """GOOD with `changes` to the keys of its `[[activity_js]]`."""
    return greet(**changes) + STUB


GOOD = good()


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
            good(extra={"colour": "red"}),
            ['[[activity_js]] #1 "greet"', "key `colour`", "unknown key"],
        ),
        (good(location="nope.js"), ["key `location`", "file not found", "nope.js"]),
        (
            good(return_type="result<string, strin>"),
            ["key `return_type`", "invalid type"],
        ),
        (good(return_type="string"), ["key `return_type`", "must be a result"]),
        (good(params=[("name", "lizt<u8>")]), ["key `params[0].type`"]),
        (good(ffqn="greet"), ["key `ffqn`", "namespace:package/interface.function"]),
        (good(max_retries=-1), ["key `max_retries`"]),
        (
            good(retry_exp_backoff={"fortnights": 1}),
            ["key `retry_exp_backoff.fortnights`"],
        ),
        (
            good(exec={"lock_expiry": seconds(2), "batch_size": 0}),
            ["key `exec.batch_size`"],
        ),
        (good(exec={"lock_expiry": seconds(2), "turbo": True}), ["key `exec.turbo`"]),
        (
            good(exec={"lock_expiry": seconds(2), "tick_sleep": ms(0)}),
            ["key `exec.tick_sleep`", "must be positive"],
        ),
        (good(env_vars=["FROM_ENV", 42, "MISSING"]), ["key `env_vars[1]`"]),
        (GOOD + greet(), ["duplicate name `greet`"]),
    ],
)
def test_bad_deployment_names_the_problem(
    tmp_path: Path, text: str | Deployment, fragments: list[str]
) -> None:
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
