"""Which database `obelisk server run` uses.

In order: `--database-url`, then `OBELISK_DATABASE_URL`, then the `[database.postgres]`
table of the `--config` TOML file, else SQLite in the data directory:

```toml
[database.postgres]
host = "db.internal"        # default localhost
port = 5432                 # default 5432
user = "obelisk"
password_env = "PGPASSWORD" # or password = "…" (the environment keeps it out of files)
dbname = "obelisk"
schema = "public"           # default public; one schema = one shared engine
```
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import StorageError
from engine.storage.postgres import DATABASE_URL_ENV, dsn_from_parts, parse_dsn


class ConfigError(ValueError):
    """A server config that cannot be used; the message names file, table and key."""


@dataclass(frozen=True, slots=True)
class DatabaseChoice:
    url: str | None  # None: SQLite in the data dir
    source: str

    def describe(self, data_dir: Path) -> str:
        if self.url is None:
            from engine.storage.sharded import existing_shards

            shards = existing_shards(data_dir)
            more = f" and {shards - 1} more shard(s)" if shards > 1 else ""
            return f"SQLite {data_dir / 'obelisk.sqlite'}{more}"
        return f"{parse_dsn(self.url).description} (from {self.source})"


_POSTGRES_KEYS = {
    "host": str,
    "port": int,
    "user": str,
    "password": str,
    "password_env": str,
    "dbname": str,
    "schema": str,
}


def choose_database(
    flag: str | None, environ: Mapping[str, str], config: str | os.PathLike[str] | None
) -> DatabaseChoice:
    if flag:
        return _checked(DatabaseChoice(flag, "--database-url"))
    if environ.get(DATABASE_URL_ENV):
        return _checked(DatabaseChoice(environ[DATABASE_URL_ENV], DATABASE_URL_ENV))
    if config is None:
        return DatabaseChoice(None, "default")
    path = Path(config)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    for key in data:
        if key != "database":
            raise ConfigError(f"{path}: unknown table or key {key!r} (expected [database])")
    database = data.get("database", {})
    if not isinstance(database, dict):
        raise ConfigError(f"{path}: database must be a table")
    for key in database:
        if key != "postgres":
            raise ConfigError(f"{path}: [database]: unknown key {key!r} (expected postgres)")
    if "postgres" not in database:
        return DatabaseChoice(None, str(path))
    pg = database["postgres"]
    if not isinstance(pg, dict):
        raise ConfigError(f"{path}: database.postgres must be a table")
    values: dict[str, Any] = {}
    for key, value in pg.items():
        want = _POSTGRES_KEYS.get(key)
        if want is None:
            raise ConfigError(
                f"{path}: [database.postgres]: unknown key {key!r} "
                f"(known: {', '.join(_POSTGRES_KEYS)})"
            )
        if not isinstance(value, want) or isinstance(value, bool):
            raise ConfigError(
                f"{path}: [database.postgres] {key}: expected {want.__name__}, got {value!r}"
            )
        values[key] = value
    if "password" in values and "password_env" in values:
        raise ConfigError(f"{path}: [database.postgres]: give password or password_env, not both")
    password = values.get("password")
    if "password_env" in values:
        password = environ.get(values["password_env"])
        if password is None:
            raise ConfigError(
                f"{path}: [database.postgres] password_env: {values['password_env']} is not set"
            )
    port = values.get("port", 5432)
    if not 0 < port < 65536:
        raise ConfigError(f"{path}: [database.postgres] port: {port} is not a port")
    url = dsn_from_parts(
        host=values.get("host", "localhost"),
        port=port,
        user=values.get("user"),
        password=password,
        dbname=values.get("dbname"),
        schema=values.get("schema"),
    )
    return _checked(DatabaseChoice(url, f"{path} [database.postgres]"))


def _checked(choice: DatabaseChoice) -> DatabaseChoice:
    assert choice.url is not None
    try:
        parse_dsn(choice.url)
    except StorageError as e:
        raise ConfigError(f"{choice.source}: {e}") from None
    return choice
