"""Lists of executions: a `ListFilter` as SQL, and the rows it selects."""

from __future__ import annotations

from typing import Any

from engine.storage.common import (
    event_type,
    execution_row,
    summary_decoder,
    us,
)
from engine.storage.contract import (
    ExecutionRow,
    ListFilter,
)

_summary_decoder = summary_decoder


_ORDER_BY: dict[str, str] = {
    "created_desc": "created_at DESC, execution_id DESC",
    "created_asc": "created_at ASC, execution_id ASC",
    "updated_desc": "updated_at DESC, execution_id DESC",
}


#: A finished row's result class (`engine.core.state_names.result_class`) from its
#: summary, without decoding it: the summary is JSON and its `underlying` (the Finished
#: state, with `result_kind`) comes before `result`, the only field holding user data,
#: and after fields whose strings are escaped: so the first `"result_kind":"` is the
#: Finished state's, and its first two letters tell ok / err / execution_failure apart.
#: Only meaningful where `state = 'finished'`.
RESULT_CLASS_SQL = (
    '(CASE substr(CAST(summary AS TEXT), instr(CAST(summary AS TEXT), \'"result_kind":"\') + 15, 2)'
    " WHEN 'ok' THEN 'ok' WHEN 'er' THEN 'err' ELSE 'failed' END)"
)


def _list_where(flt: ListFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or empty) of a list filter."""
    where: list[str] = []
    args: list[Any] = []
    if flt.ffqn_prefix:
        where.append("ffqn >= ? AND ffqn < ?")
        args += [flt.ffqn_prefix, flt.ffqn_prefix + "\U0010ffff"]
    if flt.states:
        where.append(f"state IN ({','.join('?' * len(flt.states))})")
        args += list(flt.states)
    if flt.results:
        where.append(
            f"state = 'finished' AND {RESULT_CLASS_SQL} IN ({','.join('?' * len(flt.results))})"
        )
        args += list(flt.results)
    if flt.hide_finished:
        where.append("state != 'finished'")
    if flt.top_level_only:
        where.append("parent_id IS NULL")
    if flt.id_prefix:
        where.append("execution_id >= ? AND execution_id < ?")
        args += [flt.id_prefix, flt.id_prefix + "\U0010ffff"]
    if flt.before_id and flt.before_created_at is not None:
        where.append("(created_at, execution_id) < (?, ?)")
        args += [us(flt.before_created_at), flt.before_id]
    elif flt.before_id:
        where.append(
            "(created_at, execution_id) < (SELECT created_at, execution_id FROM executions "
            "WHERE execution_id = ?)"
        )
        args.append(flt.before_id)
    return (" WHERE " + " AND ".join(where) if where else ""), args


_event_type = event_type


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
        _summary_decoder.decode(blob),
    )
