"""Control hosts that start at once on one empty PostgreSQL database migrate it one at a
time (an advisory lock, store/db.py): every host starts, none fails or waits forever on
a table another one is creating (without the lock, four at once hung)."""

from __future__ import annotations

import threading

from llmgw_runtime.store import Store
from tests.support.postgres import PostgresServer


def test_four_hosts_migrating_one_empty_database_at_once_all_start(
        postgres: PostgresServer) -> None:
    url = postgres.create_database("t_migrate_together")
    stores = [Store(url) for _ in range(4)]
    results: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(stores))

    def migrate(store: Store) -> None:
        try:
            start.wait()
            results.append(store.migrate())
        except BaseException as exc:        # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "the migrations waited on each other"
    for s in stores:
        s.dispose()
    assert errors == []
    assert len(set(results)) == 1 and len(results) == 4
