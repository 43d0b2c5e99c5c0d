"""PostgreSQL: what the console's counts by result cost on a large table.

    .venv/bin/python -m bench.pg_counts [--rows 100000] [--samples 20]
        [--database-url URL] [--json]

Without `--database-url` a throw-away durable cluster is started (`tests/pg_cluster.py`)
and removed at the end; each run gets a fresh schema. A few executions of each result
class (ok, err, execution failure) and some pending ones are written through
`PostgresStorage`, then copied with SQL (new ids, the same states and summaries) up to
`--rows` rows, 80 % finished. Timed, median of `--samples` calls each:

* `count_by_state(results=True)` — what each console refresh asks (the storage's query,
  through the `result_class` column and its index since schema 4);
* the same counts computed from every row's summary (the query before schema 4), on the
  same table, for comparison;
* both again after `--churn` of the rows were updated (pages whose visibility PostgreSQL
  no longer knows without reading them, as on a busy database between vacuums).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from bench.workflow_throughput import machine
from engine.core import events as ev
from engine.storage.contract import AppendExtras
from engine.storage.postgres import PostgresStorage
from engine.storage.postgres.queries import RESULT_CLASS_SQL

#: The query of `count_by_state(results=True)` before schema 4: every summary is read.
FROM_SUMMARIES = (
    f"SELECT state, CASE WHEN state = 'finished' THEN {RESULT_CLASS_SQL} END, count(*) "
    "FROM executions GROUP BY 1, 2"
)
RESULTS: list[ev.ExecutionResult] = [
    ev.ResultOk({"value": 42}),
    ev.ResultErr("not found"),
    ev.ExecutionFailure("timed_out", "too slow"),
]


async def _templates(storage: PostgresStorage) -> None:
    """Executions of every kind the table will hold, written the engine's way."""
    from tests.storage.conftest import ACTIVITY_FFQN, Executor, at, create_request

    executor = Executor([ACTIVITY_FFQN])
    for i in range(10):
        for result in RESULTS:
            req = create_request()
            await storage.create(req, at(i))
            [locked] = await storage.lock_pending(**executor.lock_args(at(i), batch_size=1))
            await storage.append(
                req.execution_id,
                locked.next_version,
                [ev.Finished(result)],
                at(i + 1),
                AppendExtras(run_id=locked.run_id),
            )
        await storage.create(create_request(scheduled_at=at(3600)), at(i))


async def _fill(conn: Any, rows: int) -> None:
    """Copies of the templates up to `rows` rows: 80 % of them finished."""
    have = await conn.fetchval("SELECT count(*) FROM executions")
    finished = int(rows * 0.8) - await conn.fetchval(
        "SELECT count(*) FROM executions WHERE state = 'finished'"
    )
    for state, n in (("finished", finished), ("pending_at", rows - have - finished)):
        await conn.execute(
            "WITH t AS (SELECT *, row_number() OVER (ORDER BY execution_id) - 1 AS k, "
            "count(*) OVER () AS n FROM executions "
            "WHERE state = $2 AND execution_id NOT LIKE '%.c%') "
            "INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
            "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
            "SELECT t.execution_id || '.c' || g, t.ffqn, t.component_type, NULL, t.state, "
            "t.pending_at, t.lock_expires_at, t.next_version, t.created_at + g, "
            "t.updated_at + g, t.summary FROM generate_series(1, $1) AS g "
            "JOIN t ON t.k = g % t.n",
            n,
            state,
        )


async def _median_ms(call: Any, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 2)


async def measure(url: str, rows: int, samples: int, churn: float) -> dict[str, Any]:
    storage = await PostgresStorage.open(url)
    try:
        await _templates(storage)
        conn = await storage._pool.acquire()  # (a bench: raw SQL on its own schema)
        try:
            await _fill(conn, rows)
            await conn.execute("VACUUM ANALYZE executions")
            counts = await storage.count_by_state(results=True)
            old = await conn.fetch(FROM_SUMMARIES)
            assert sum(n for state, _, n in old if state == "finished") == counts["finished"]
            out: dict[str, Any] = {"rows": rows, "counts": counts}
            out["vacuumed"] = {
                "count_by_state_ms": await _median_ms(
                    lambda: storage.count_by_state(results=True), samples
                ),
                "from_summaries_ms": await _median_ms(lambda: conn.fetch(FROM_SUMMARIES), samples),
            }
            await conn.execute(
                "UPDATE executions SET updated_at = updated_at + 1 WHERE random() < $1", churn
            )
            out["churned"] = {
                "rows_updated": churn,
                "count_by_state_ms": await _median_ms(
                    lambda: storage.count_by_state(results=True), samples
                ),
                "from_summaries_ms": await _median_ms(lambda: conn.fetch(FROM_SUMMARIES), samples),
            }
            plan = await conn.fetch(
                "EXPLAIN SELECT state, result_class, count(*) FROM executions GROUP BY 1, 2"
            )
            out["plan"] = [r[0] for r in plan]
            return out
        finally:
            await storage._pool.release(conn)
    finally:
        await storage.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--churn", type=float, default=0.1, help="share of rows updated")
    p.add_argument("--database-url", help="an existing database (a fresh schema is used)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from tests.pg_cluster import create_cluster, schema_dsn

    cluster = None if args.database_url else create_cluster(durable=True)
    try:
        base = args.database_url or cluster.dsn()  # type: ignore[union-attr]
        url = schema_dsn(base, f"bench-pg-counts-{time.time_ns()}")
        result = asyncio.run(measure(url, args.rows, args.samples, args.churn))
    finally:
        if cluster is not None:
            cluster.stop()
            cluster.remove()
    result["machine"] = machine()
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['rows']:,} rows; counts {result['counts']}")
    for phase in ("vacuumed", "churned"):
        r = result[phase]
        print(
            f"  {phase}: count_by_state(results=True) {r['count_by_state_ms']} ms, "
            f"from every summary {r['from_summaries_ms']} ms"
        )
    print("  plan: " + " / ".join(line.strip() for line in result["plan"]))


if __name__ == "__main__":
    main()
