"""A throw-away PostgreSQL cluster for the tests: `initdb` + `pg_ctl` on a temp data dir,
listening on loopback (and any extra addresses, for the multi-host test) on a free port.

As root, the server runs as an unprivileged user (PostgreSQL refuses to run as root):
`postgres` when it exists (Debian's package creates it), through `runuser`.
The superuser is `postgres` with password `PASSWORD`, password authentication over TCP
(so that a wrong password is a real error).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PASSWORD = "obelisk-test"
SUPERUSER = "postgres"


def postgres_required() -> bool:
    """In CI (`CI` set, as `.ci/run` runs) or with `OBELISK_REQUIRE_POSTGRES=1`, tests
    that need PostgreSQL fail when no server can be started, instead of skipping."""
    ci = os.environ.get("CI", "").strip().lower()
    return ci not in ("", "0", "false", "no") or os.environ.get("OBELISK_REQUIRE_POSTGRES") == "1"


class ClusterUnavailable(Exception):
    """No PostgreSQL server can be started here (the message says why)."""


def find_bin_dir() -> Path:
    """The directory of `initdb` and `pg_ctl`: PATH, else Debian's versioned dirs."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not candidates:
        raise ClusterUnavailable(
            "no PostgreSQL server binaries (initdb) on PATH or in /usr/lib/postgresql/*/bin: "
            "install Debian's postgresql package (apt-get install -y postgresql)"
        )
    return Path(candidates[-1]).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    data_dir: Path
    port: int
    bin_dir: Path
    run_as: str | None
    addresses: list[str] = field(default_factory=lambda: ["127.0.0.1"])

    def dsn(self, dbname: str = "postgres", host: str = "127.0.0.1", **query: str) -> str:
        url = f"postgresql://{SUPERUSER}:{PASSWORD}@{host}:{self.port}/{dbname}"
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        return url

    def _cmd(self, *args: str) -> list[str]:
        if self.run_as is None:
            return list(args)
        return ["runuser", "-u", self.run_as, "--", *args]

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._cmd(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args),
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def start(self) -> None:
        listen = ",".join(self.addresses)
        options = (
            f"-c listen_addresses='{listen}' -c port={self.port} "
            f"-c unix_socket_directories='{self.data_dir}' -c max_connections=200 "
            f"{self.extra_options}"
        )
        result = self.pg_ctl(
            "-w",
            "-t",
            "60",
            "-l",
            str(self.data_dir / "server.log"),
            "-o",
            options,
            "start",
            check=False,
        )
        if result.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ClusterUnavailable(
                f"pg_ctl start failed ({result.returncode}): {result.stderr.strip()}\n{tail}"
            )

    extra_options: str = ""

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-w", "-t", "60", "-m", mode, "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _unprivileged_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise ClusterUnavailable(
            "running as root and there is no 'postgres' user to run the server as "
            "(Debian's postgresql package creates it)"
        ) from None
    if shutil.which("runuser") is None:
        raise ClusterUnavailable("running as root and runuser is missing")
    return SUPERUSER


def create_cluster(
    *, durable: bool = False, addresses: list[str] | None = None, port: int | None = None
) -> Cluster:
    """initdb a new cluster in a temp dir and start it. `durable=False` turns fsync off
    (tests only: a crash of the machine is not what they test); benchmarks pass True."""
    bin_dir = find_bin_dir()
    run_as = _unprivileged_user()
    data_dir = Path(tempfile.mkdtemp(prefix="obelisk-pg-"))
    pwfile = data_dir.with_name(data_dir.name + ".pw")
    try:
        pwfile.write_text(PASSWORD + "\n")
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            os.chown(data_dir, entry.pw_uid, entry.pw_gid)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        cluster = Cluster(data_dir, port or free_port(), bin_dir, run_as)
        if addresses:
            cluster.addresses = addresses
        result = subprocess.run(
            cluster._cmd(
                str(bin_dir / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise ClusterUnavailable(f"initdb failed: {result.stderr.strip()[-2000:]}")
        # Test hosts in network namespaces connect from their own addresses.
        with (data_dir / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 scram-sha-256\n")
        if not durable:
            cluster.extra_options = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        cluster.start()
        return cluster
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise
    finally:
        with contextlib.suppress(OSError):
            pwfile.unlink()


def schema_name(key: Path | str) -> str:
    """A schema name for a test, derived from its temp dir."""
    import hashlib

    return "t_" + hashlib.sha1(str(key).encode()).hexdigest()[:20]


def schema_dsn(dsn: str, key: Path | str) -> str:
    """`dsn` with the test's own `?schema=`."""
    return dsn + ("&" if "?" in dsn else "?") + f"schema={schema_name(key)}"


def drop_schema(dsn: str, key: Path | str) -> None:
    """Drop a test's schema (a test against a long-lived server leaves nothing behind)."""
    import asyncio

    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn.split("?")[0], timeout=10)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema_name(key)}" CASCADE')
        finally:
            await conn.close()

    with contextlib.suppress(Exception):
        asyncio.run(drop())
