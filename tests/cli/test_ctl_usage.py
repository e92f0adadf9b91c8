"""``ctl keys`` with limits and ``ctl usage`` (issue 17), against a real control service;
usage arrives as routers send it (``POST /api/v1/usage`` with the router token)."""

from __future__ import annotations

import json

import requests

from llmgw_runtime.security import hash_token
from tests.cli.test_commands import control, ctl  # noqa: F401 - the fixture
from tests.control.conftest import ADMIN, ROUTER
from tests.control.test_usage_api import CATALOG  # chat, embed: others are "(unknown)"


def _report(url: str, seq: int, entries: list[dict[str, object]]) -> None:
    resp = requests.post(url + "/api/v1/usage", timeout=10,
                         json={"reporter": "router-cli-test", "seq": seq, "entries": entries},
                         headers={"Authorization": f"Bearer {ROUTER}"})
    assert resp.status_code == 200, resp.text


def test_create_a_key_with_limits_list_them_and_lift_one(control: str) -> None:  # noqa: F811
    code, out = ctl(control, "keys", "create", "app", "--rpm", "60", "--tpm", "10000")
    assert code == 0, out
    assert "API key app (60 requests/min; 10000 tokens/min) (shown once" in out
    code, out = ctl(control, "keys", "list")
    header, row = out.splitlines()[0].split(), out.splitlines()[1].split()
    assert header[4:6] == ["RPM", "TPM"] and row[:6] == ["app", "normal", "all", "never",
                                                         "60", "10000"]
    code, out = ctl(control, "keys", "set", "app", "--rpm", "none", "--tpm", "500")
    assert code == 0 and "API key app: rpm none; tpm 500" in out
    [key] = json.loads(ctl(control, "keys", "list", "-o", "json")[1])["keys"]
    assert (key["rpm"], key["tpm"]) == (None, 500)
    assert ctl(control, "keys", "list")[1].splitlines()[1].split()[4:6] == ["-", "500"]


def test_ctl_keys_refuse_bad_limits_before_asking(control: str) -> None:  # noqa: F811
    # Not numbers: ctl's own words; out of bounds: the bounds of api.admin's messages.
    for args, says in ((("create", "x", "--rpm", "0"), "'--rpm': Input should be greater "
                        "than or equal to 1 (got 0)"),
                       (("create", "x", "--tpm", "lots"), "'--tpm': 'lots' is not a whole "
                        "number"),
                       (("create", "x", "--rpm", "none"), "'--rpm': 'none' is not a whole "
                        "number"),
                       (("set", "x", "--rpm", "-1"), "'--rpm': Input should be greater than "
                        "or equal to 1 (got -1)"),
                       (("set", "x", "--tpm", "10000000001"), "'--tpm': Input should be less "
                        "than or equal to 10000000000"),
                       (("create", "x", "--rpm", "0", "--tpm", "0"), "'--rpm' / '--tpm'")):
        code, out = ctl(control, "keys", *args)
        assert code == 2 and says in out, out


def test_ctl_usage_shows_tokens_per_key_and_model(control: str) -> None:  # noqa: F811
    code, out = ctl(control, "keys", "create", "app")
    digest = hash_token(out.splitlines()[-1].strip())
    assert requests.put(control + "/api/v1/catalog", data=CATALOG, timeout=10,
                        headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
    _report(control, 1, [
        {"key": digest, "model": "chat", "requests": 3, "prompt_tokens": 120,
         "completion_tokens": 40},
        {"key": digest, "model": "embed", "requests": 1, "prompt_tokens": 9,
         "completion_tokens": 0, "refused": 2},       # e.g. over its rpm limit (issue 29)
        {"key": "-", "model": "chat", "requests": 1, "prompt_tokens": 5,
         "completion_tokens": 5}])
    code, out = ctl(control, "usage")
    assert code == 0, out
    lines = [line.split() for line in out.splitlines()]
    assert lines == [["KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL", "REFUSED"],
                     ["-", "chat", "1", "5", "5", "10", "0"],
                     ["app", "chat", "3", "120", "40", "160", "0"],
                     ["app", "embed", "1", "9", "0", "9", "2"]]
    code, out = ctl(control, "usage", "--by", "key", "--since", "7d")
    assert [line.split() for line in out.splitlines()][1:] == [
        ["-", "1", "5", "5", "10", "0"], ["app", "4", "129", "40", "169", "2"]]
    data = json.loads(ctl(control, "usage", "--by", "model", "-o", "json")[1])
    assert data["by"] == "model" and data["rows"] == [
        {"model": "chat", "requests": 4, "prompt_tokens": 125, "completion_tokens": 45,
         "refused": 0},
        {"model": "embed", "requests": 1, "prompt_tokens": 9, "completion_tokens": 0,
         "refused": 2}]
    code, out = ctl(control, "usage", "--since", "soon")
    assert code == 2 and "--since" in out
