"""The shipped SQLite dataset, opened read-only per session, and a bounded query runner."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SQL_FILE = DATA_DIR / "finqa.sql"
QUESTIONS_FILE = DATA_DIR / "questions.json"

MAX_QUERY_CHARS = 5_000
MAX_ROWS = 200
QUERY_TIMEOUT_S = 2.0
MAX_VALUE_BYTES = 100_000

TABLE_DESCRIPTIONS = {
    "companies": "One row per company: name, ticker, sector, headquarters, year founded.",
    "income_statement": "Yearly income statement per company (fiscal years 2019-2023), millions of USD; eps in USD.",
    "balance_sheet": "Year-end balance sheet per company (2019-2023), millions of USD; employees is a head count.",
    "segment_revenue": "Yearly revenue of each business segment per company, millions of USD.",
}

_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_TEMPLATE_LOCK = threading.Lock()


class QueryError(ValueError):
    """A query was refused or failed; the message says why."""


@lru_cache(maxsize=1)
def _template() -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    connection.executescript(SQL_FILE.read_text(encoding="utf-8"))
    return connection


@lru_cache(maxsize=1)
def load_questions() -> List[Dict[str, Any]]:
    """The shipped questions: ``id``, ``company``, ``question``, ``answer``, ``answer_type``, ``sql``."""
    return json.loads(QUESTIONS_FILE.read_text(encoding="utf-8"))


def _authorize(action: int, *args: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def open_database() -> sqlite3.Connection:
    """A private in-memory copy of the dataset that refuses everything but reading."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    with _TEMPLATE_LOCK:
        _template().backup(connection)
    connection.execute("PRAGMA query_only = ON")
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    connection.set_authorizer(_authorize)
    return connection


def run_query(connection: sqlite3.Connection, query: str, timeout_s: float = QUERY_TIMEOUT_S) -> Dict[str, Any]:
    """Run one read-only statement; at most ``MAX_ROWS`` rows come back (``truncated`` says if more
    were there) and it is interrupted after ``timeout_s`` seconds."""
    if not isinstance(query, str) or not query.strip():
        raise QueryError("the query is empty: write one SELECT statement")
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(f"the query is {len(query)} characters long: the limit is {MAX_QUERY_CHARS}")
    deadline = time.monotonic() + timeout_s
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cursor = connection.execute(query)
        rows = cursor.fetchmany(MAX_ROWS + 1)
        columns = [d[0] for d in cursor.description or ()]
    except sqlite3.DatabaseError as exc:
        message = str(exc)
        if "not authorized" in message or "readonly" in message:
            raise QueryError(
                "sql_query is read-only: only SELECT statements (and WITH ... SELECT) are allowed"
            ) from None
        if "interrupted" in message:
            raise QueryError(f"the query ran longer than {timeout_s:g} s and was stopped") from None
        raise QueryError(f"SQL error: {message}") from None
    except sqlite3.Warning as exc:  # e.g. more than one statement
        raise QueryError(f"SQL error: {exc}: send one statement at a time") from None
    finally:
        connection.set_progress_handler(None, 0)
    truncated = len(rows) > MAX_ROWS
    return {"columns": columns, "rows": [list(r) for r in rows[:MAX_ROWS]], "truncated": truncated}


def table_info(connection: sqlite3.Connection, table: str, company_id: Optional[int] = None) -> Dict[str, Any]:
    """Columns (name, type) of ``table``, its description, and its row count (for one company if given)."""
    columns = [{"name": row[1], "type": row[2]} for row in _template_rows(f"PRAGMA table_info({table})")]
    info: Dict[str, Any] = {"table": table, "description": TABLE_DESCRIPTIONS[table], "columns": columns}
    if company_id is not None and any(c["name"] == "company_id" for c in columns):
        count, first, last = _template_rows(
            f"SELECT COUNT(*), MIN(fiscal_year), MAX(fiscal_year) FROM {table} WHERE company_id = ?"
            if any(c["name"] == "fiscal_year" for c in columns)
            else f"SELECT COUNT(*), NULL, NULL FROM {table} WHERE company_id = ?",
            (company_id,),
        )[0]
        info.update(company_rows=count, fiscal_years=[first, last] if first is not None else None)
    if table == "segment_revenue" and company_id is not None:
        info["segments"] = [
            r[0]
            for r in _template_rows(
                "SELECT DISTINCT segment FROM segment_revenue WHERE company_id = ? ORDER BY segment", (company_id,)
            )
        ]
    return info


def _template_rows(sql: str, params: tuple = ()) -> List[tuple]:
    with _TEMPLATE_LOCK:
        return _template().execute(sql, params).fetchall()


def companies() -> List[Dict[str, Any]]:
    """``company_id``, ``name`` and ``ticker`` of every company."""
    return [
        {"company_id": r[0], "name": r[1], "ticker": r[2]}
        for r in _template_rows("SELECT company_id, name, ticker FROM companies ORDER BY company_id")
    ]
