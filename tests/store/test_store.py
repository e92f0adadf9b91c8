"""The store on both backends: migrations, the catalog, integer booleans, leases."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.store import Store, repo
from llmgw_runtime.store.schema import models

CAT = """models:
  - {name: a, source: /a.gguf, engine: llama.cpp, profile: {class: cpu}, on_demand: true}
  - {name: b, source: /b.gguf, engine: vllm, profile: {class: a100-80g}}
"""


def test_migrate_is_repeatable(store: Store) -> None:
    assert store.migrate() == "0019"
    assert store.migrate() == "0019"


def test_apply_creates_updates_and_reports_unchanged(store: Store) -> None:
    with store.begin() as conn:
        first = repo.apply_catalog(conn, catalog.parse(CAT), 1.0)
    with store.begin() as conn:
        again = repo.apply_catalog(conn, catalog.parse(CAT.replace("/b.gguf", "/b2.gguf")), 2.0)
    assert first["created"] == ["a", "b"]
    assert again == {"created": [], "updated": ["b"], "unchanged": ["a"], "deleted": []}


def test_booleans_are_written_as_integers(store: Store) -> None:
    with store.begin() as conn:
        repo.apply_catalog(conn, catalog.parse(CAT), 1.0)
        raw = conn.execute(sa.text("SELECT name, on_demand, parked FROM models ORDER BY name"))
        rows = [tuple(r) for r in raw]
    assert rows == [("a", 1, 0), ("b", 0, 0)]
    assert all(type(v) is int for r in rows for v in r[1:])


def test_a_new_definition_unparks(store: Store) -> None:
    """The rule lives in the fleet layer; the store stores what it is told."""
    from llmgw_runtime.control import fleet

    with store.begin() as conn:
        fleet.apply_catalog(conn, catalog.parse(CAT), 1.0, prune=False)
        repo.update_model(conn, "b", parked=1, consecutive_failures=5, last_error="boom")
    with store.begin() as conn:
        fleet.apply_catalog(conn, catalog.parse(CAT.replace("class: a100-80g",
                                                            "class: h100-80g")), 2.0,
                            prune=False)
        row = conn.execute(sa.select(models).where(models.c.name == "b")).one()
    assert (row.parked, row.consecutive_failures, row.last_error) == (0, 0, None)


def test_prune_deletes_models_absent_from_the_file(store: Store) -> None:
    with store.begin() as conn:
        repo.apply_catalog(conn, catalog.parse(CAT), 1.0)
        result = repo.apply_catalog(conn, catalog.parse(CAT).__getitem__(slice(0, 1)), 2.0,
                                    prune=True)
    assert result["deleted"] == ["b"]


def test_lease_is_exclusive_until_it_expires(store: Store) -> None:
    with store.begin() as conn:
        now = store.now(conn)
        assert repo.try_lease(conn, "l", "one", now, 5)
        assert not repo.try_lease(conn, "l", "two", now + 1, 5)
        assert repo.try_lease(conn, "l", "one", now + 2, 5)          # renew
        assert repo.holds_lease(conn, "l", "one", now + 3)
        assert repo.try_lease(conn, "l", "two", now + 8, 5)          # expired: taken over
        assert not repo.holds_lease(conn, "l", "one", now + 8)


def test_database_clock_is_unix_seconds(store: Store) -> None:
    import time

    with store.begin() as conn:
        assert abs(store.now(conn) - time.time()) < 5


def test_a_multi_host_url_finds_the_writable_server(postgres) -> None:  # type: ignore[no-untyped-def]
    from tests.support.procs import free_port

    url = postgres.create_database("multihost")
    dead = free_port()
    host_part = f"127.0.0.1:{dead},127.0.0.1:{postgres.port}"
    multi = url.replace(f"127.0.0.1:{postgres.port}", host_part) + \
        "?target_session_attrs=read-write"
    store = Store(multi)
    try:
        assert store.migrate() == "0019"
        with store.begin() as conn:
            repo.add_event(conn, 1.0, "test", "s", "written through a multi-host URL")
            assert repo.list_events(conn)[0]["message"].startswith("written")
    finally:
        store.dispose()


def test_an_unreachable_store_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from llmgw_runtime.errors import StoreError
    from tests.support.procs import free_port

    store = Store(f"postgresql://llmgw:secret@127.0.0.1:{free_port()}/llmgw")
    with pytest.raises(StoreError) as info:
        with store.begin() as conn:
            store.now(conn)
    message = str(info.value)
    assert "cannot be reached" in message and "secret" not in message
    assert "llmgw:***@127.0.0.1" in message


def test_the_store_clock_without_a_query_agrees_with_the_database_clock(store: Store) -> None:
    with store.begin() as conn:
        exact = store.now(conn)
        cached = store.clock(conn)
        later = store.clock(conn)
    assert abs(cached - exact) < 0.5 and later >= cached
