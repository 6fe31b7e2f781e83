"""Fixtures. Tests that need PostgreSQL read IDEM_TEST_DSN (the role `app`, owner of a
database with the extension and USAGE on its schema) and IDEM_TEST_ADMIN_DSN (a superuser of
that database); test/suites/client_python.sh sets both. Without them those tests are skipped,
unless IDEM_TEST_REQUIRE_DB=1 (the suite), where they fail."""

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def _need(var):
    value = os.environ.get(var)
    if not value:
        if os.environ.get("IDEM_TEST_REQUIRE_DB") == "1":
            pytest.fail(f"{var} is not set")
        pytest.skip(f"{var} is not set (no test server)")
    return value


@pytest.fixture(scope="session")
def dsn():
    return _need("IDEM_TEST_DSN")


@pytest.fixture(scope="session")
def admin_dsn():
    return _need("IDEM_TEST_ADMIN_DSN")


@pytest.fixture(scope="session")
def tables(dsn):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, tenant text NOT NULL, "
            "amount int NOT NULL, note text)"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS broker_effects (message_id text NOT NULL, consumer text, amount int)"
        )
    return dsn


@pytest.fixture
def key():
    return "t-" + uuid.uuid4().hex


@pytest.fixture
def sql(tables):
    """sql(query, *params) -> all rows, on its own autocommit connection as app."""
    import psycopg

    conn = psycopg.connect(tables, autocommit=True)

    def run(query, *params):
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else None

    yield run
    conn.close()
