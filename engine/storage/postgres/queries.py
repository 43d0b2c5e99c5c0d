"""Lists of executions: a `ListFilter` as SQL, and the rows it selects."""

from __future__ import annotations

from typing import Any

from engine.storage.common import (
    execution_row,
    summary_decoder,
    us,
)
from engine.storage.contract import (
    ExecutionRow,
    ListFilter,
)

_ORDER_BY: dict[str, str] = {
    "created_desc": "created_at DESC, execution_id DESC",
    "created_asc": "created_at ASC, execution_id ASC",
    "updated_desc": "updated_at DESC, execution_id DESC",
}


#: A finished row's result class (`engine.core.state_names.result_class`) from its
#: summary, without decoding it: the summary is JSON and its `underlying` (the Finished
#: state, with `result_kind`) comes before `result`, the only field holding user data,
#: and after fields whose strings are escaped: so the first `"result_kind":"` is the
#: Finished state's, and its first two bytes tell ok / err / execution_failure apart.
#: Only meaningful where `state = 'finished'`. Stored in the `result_class` column
#: (migration 4), which the queries read.
RESULT_CLASS_SQL = (
    '(CASE substring(summary FROM position(\'"result_kind":"\'::bytea IN summary) + 15 FOR 2)'
    " WHEN 'ok'::bytea THEN 'ok' WHEN 'er'::bytea THEN 'err' ELSE 'failed' END)"
)


def _list_where(flt: ListFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or empty) of a list filter, $1…$n."""
    where: list[str] = []
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    top = chr(0x10FFFF)  # above every character: the end of a prefix range
    if flt.ffqn_prefix:
        where.append(f"ffqn >= {arg(flt.ffqn_prefix)} AND ffqn < {arg(flt.ffqn_prefix + top)}")
    if flt.states:
        where.append(f"state = ANY({arg(list(flt.states))}::text[])")
    if flt.results:
        where.append(f"state = 'finished' AND result_class = ANY({arg(list(flt.results))}::text[])")
    if flt.hide_finished:
        where.append("state != 'finished'")
    if flt.top_level_only:
        where.append("parent_id IS NULL")
    if flt.id_prefix:
        where.append(
            f"execution_id >= {arg(flt.id_prefix)} AND execution_id < {arg(flt.id_prefix + top)}"
        )
    if flt.before_id and flt.before_created_at is not None:
        where.append(
            f"(created_at, execution_id) < ({arg(us(flt.before_created_at))}, {arg(flt.before_id)})"
        )
    elif flt.before_id:
        where.append(
            "(created_at, execution_id) < (SELECT created_at, execution_id FROM executions "
            f"WHERE execution_id = {arg(flt.before_id)})"
        )
    return (" WHERE " + " AND ".join(where) if where else ""), args


_ROW_COLUMNS = "execution_id, ffqn, component_type, parent_id, created_at, updated_at, summary"


def _row(row: Any) -> ExecutionRow:
    execution_id, ffqn, component_type, parent_id, created_at, updated_at, blob = row
    return execution_row(
        execution_id,
        ffqn,
        component_type,
        parent_id,
        created_at,
        updated_at,
        summary_decoder.decode(blob),
    )
