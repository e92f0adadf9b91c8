"""Failures of the router's HTTP data path that the server and the relay share."""

from __future__ import annotations


class StreamBroken(Exception):
    """An answer broke off after its head went to the client: the server ends the client's
    connection without the chunked terminator (as nginx does), so the client can tell the
    answer is incomplete."""
