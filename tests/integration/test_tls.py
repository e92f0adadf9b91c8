"""HTTPS between every part: control and router serve the cluster CA's certificates; the
agent, the router, `llmgw ctl` and OpenAI clients verify them."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.ctl import ctl
from tests.support.certs import make_pki

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow


def test_the_whole_path_over_https_with_the_cluster_ca(cluster_factory: Any, tiny_model: Path,
                                                       tmp_path: Path) -> None:
    ca = make_pki(tmp_path / "pki")
    c: Cluster = cluster_factory(pki=tmp_path / "pki")
    c.start_control()
    c.apply(tiny_catalog(tiny_model))
    c.start_router()
    c.start_agent()
    c.wait_ready("tiny")
    assert c.router_url.startswith("https://")

    client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0,
                           http_client=openai.DefaultHttpxClient(
                               verify=ssl.create_default_context(cafile=str(ca))))
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert reply.choices

    untrusting = openai.OpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        untrusting.models.list()

    result = CliRunner().invoke(ctl, ["--url", c.control_url, "--token", c.admin_token,
                                      "--ca", str(ca), "models"])
    assert result.exit_code == 0 and "ready" in result.output
    refused = CliRunner().invoke(ctl, ["--url", c.control_url, "--token", c.admin_token,
                                       "models"])
    assert refused.exit_code == 1 and "CERTIFICATE_VERIFY_FAILED" in refused.output

    # A client that connects and never starts the handshake is dropped within the router's
    # keep-alive time (5 s): the handshake waits for the head's read (tls.LazyHandshake).
    address = urllib.parse.urlsplit(c.router_url)
    with socket.create_connection((address.hostname, address.port), timeout=20) as silent:
        started = time.monotonic()
        try:
            while silent.recv(4096):
                pass
        except ConnectionResetError:
            pass
        assert time.monotonic() - started < 5 + 2, "a silent TLS client was kept"
