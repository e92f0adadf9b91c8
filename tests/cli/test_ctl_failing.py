"""``ctl status`` and ``ctl models`` say a failing model is failing, with its last error,
from the one fleet summary (issue 28: it showed ``starting``)."""

from __future__ import annotations

import time

from llmgw_runtime.store import Store, repo
from tests.cli.test_commands import control, ctl  # noqa: F401 - the fixture

CATALOG = """models:
  - {name: tiny, source: file:///models/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}
"""
LOG = ("start failed: exited with 1; last log lines:\nllama_model_loader: loaded\n"
       "error: unknown argument: --flash-attn-bogus\nusage: llama-server [options]")


def test_ctl_status_and_models_say_failing_in_a_row_and_the_next_start(
        control: str, store: Store) -> None:  # noqa: F811
    from llmgw_runtime.catalog import parse as catalog
    from llmgw_runtime.control import fleet

    with store.begin() as conn:
        fleet.apply_catalog(conn, catalog.parse(CATALOG), time.time(), prune=False)
        repo.update_model(conn, "tiny", consecutive_failures=3, last_failure_at=time.time(),
                          last_error=LOG)
    for command in ("status", "models"):
        code, out = ctl(control, command)
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("tiny"))
        assert code == 0 and "failing (3 in a row, next start in " in line, out
        assert "start failed: exited with" in line, out      # the telling line (its start)
        assert "starting" not in line, line
    status = ctl(control, "status", "-o", "json")[1]
    assert '"text": "failing (3 in a row, next start in ' in status
