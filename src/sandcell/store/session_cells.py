"""Queries behind a session's cell history: numbered per session, newest kept, tenant-scoped.

Numbering first updates the session's row (last used, executions), which takes its row lock
(on SQLite the write lock every transaction takes), so two cells recorded at once get
distinct, increasing numbers on both backends.
"""

from dataclasses import asdict, replace
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update

from sandcell.domain.cells import SessionCell
from sandcell.domain.errors import NotFound
from sandcell.store.schema import session_cells, sessions


def add(conn: Connection, cell: SessionCell, keep: int) -> SessionCell:
    touched = conn.execute(
        update(sessions)
        .where(sessions.c.id == cell.session_id, sessions.c.tenant_id == cell.tenant_id)
        .values(last_used_at=cell.finished_at, executions=sessions.c.executions + 1)
    )
    if touched.rowcount == 0:
        raise NotFound("no such session")
    last = conn.execute(
        select(func.coalesce(func.max(session_cells.c.seq), 0)).where(
            session_cells.c.session_id == cell.session_id
        )
    ).scalar_one()
    numbered = replace(cell, seq=int(last) + 1)
    conn.execute(insert(session_cells).values(**asdict(numbered)))
    if numbered.seq > keep:
        conn.execute(
            delete(session_cells).where(
                session_cells.c.session_id == cell.session_id,
                session_cells.c.seq <= numbered.seq - keep,
            )
        )
    return numbered


def listed(
    conn: Connection, tenant_id: str, session_id: str, after: int | None, limit: int
) -> list[SessionCell]:
    """Oldest first: the `limit` cells after `after`, or without it the newest `limit`."""
    mine = select(session_cells).where(
        session_cells.c.session_id == session_id, session_cells.c.tenant_id == tenant_id
    )
    if after is not None:
        query = mine.where(session_cells.c.seq > after).order_by(session_cells.c.seq)
        return [_cell(row) for row in conn.execute(query.limit(limit))]
    newest = conn.execute(mine.order_by(session_cells.c.seq.desc()).limit(limit)).all()
    return [_cell(row) for row in reversed(newest)]


def _cell(row: Any) -> SessionCell:
    values = dict(row._mapping)
    values["display"] = values["display"] or []
    return SessionCell(**values)
