"""Before the control service serves: migrate the store and make sure the admin, join and
router secrets exist. A secret given in the settings is stored (hashed); one that is absent
and not stored yet is generated and shown once on the terminal, never logged."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from ..security import hash_token, new_token
from ..store import Store, accounts, repo
from .config import ControlConfig

log = logging.getLogger(__name__)

SECRETS = (("admin", "admin", "admin_token"), ("join", "join", "join_token"),
           ("router", "router", "router_token"))


def bootstrap(store: Store, config: ControlConfig, out: TextIO | None = None) -> dict[str, str]:
    """Migrate, then ensure each secret. Returns the secrets generated now (name -> token)."""
    out = out or sys.stdout
    revision = store.migrate()
    log.info("store at revision %s", revision)
    generated: dict[str, str] = {}
    with store.begin() as conn:
        import time

        now = time.time()
        for name, kind, field in SECRETS:
            given = getattr(config, field)
            if given:
                if accounts.put_account(conn, name, kind, hash_token(given), now):
                    repo.add_event(conn, now, "token", name,
                                   f"the {name} token was rotated at start-up; the old one "
                                   "is refused" + (" and its console sessions ended"
                                                   if kind == "admin" else ""))
            elif not accounts.account_exists(conn, name):
                token = new_token(kind)
                accounts.put_account(conn, name, kind, hash_token(token), now)
                generated[name] = token
    for name, token in generated.items():
        print(f"llmgw: generated the {name} token (shown once; store it now): {token}",
              file=out, flush=True)
    return generated
