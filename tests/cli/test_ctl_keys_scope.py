"""``ctl keys`` with a scope and an expiry (issue 17), against a real control service."""

from __future__ import annotations

import json

from tests.cli.test_commands import control, ctl  # noqa: F401 - the fixture


def test_create_a_scoped_expiring_key_then_lift_both(control: str) -> None:  # noqa: F811
    code, out = ctl(control, "keys", "create", "app", "--models", "chat,embed",
                    "--expires", "30d")
    assert code == 0, out
    assert "API key app (models chat, embed; expires in 29 d) (shown once" in out
    code, out = ctl(control, "keys", "list")
    header, row = out.splitlines()[0].split(), out.splitlines()[1].split()
    assert header == ["NAME", "PRIORITY", "MODELS", "EXPIRES", "RPM", "TPM", "CREATED"]
    assert row[:7] == ["app", "normal", "chat,", "embed", "in", "29", "d"]
    code, out = ctl(control, "keys", "set", "app", "--models", "all", "--expires", "never")
    assert code == 0 and "API key app: models all; expires never" in out
    [key] = json.loads(ctl(control, "keys", "list", "-o", "json")[1])["keys"]
    assert (key["models"], key["expires_at"]) == (None, None)


def test_ctl_keys_refuse_bad_scopes_and_expiries_before_asking(control: str) -> None:  # noqa: F811
    code, out = ctl(control, "keys", "create", "x", "--expires", "soon")
    assert code == 2 and "'soon' is not a lifetime; write a number of days" in out
    code, out = ctl(control, "keys", "create", "x", "--models", ",")
    assert code == 2 and "'--models': List should have at least 1 item" in out
    code, out = ctl(control, "keys", "set", "x", "--models", "a b,c")
    assert code == 2 and "'--models': must be letters, digits" in out
    code, out = ctl(control, "keys", "create", "x", "--expires", "4000d")
    assert code == 2 and "'--expires': '4000d' is longer than a key may live" in out
    code, out = ctl(control, "keys", "set", "x")
    assert code == 2 and "say what to change" in out
