"""The router's sends straight on the OS socket (router/http/rawsock.py): what a slow client
would otherwise lose."""

from __future__ import annotations

import socket

import gevent
import gevent.socket

from llmgw_runtime.router.http.rawsock import os_socket, sender


def test_a_send_larger_than_the_kernel_takes_arrives_whole_and_in_order() -> None:
    a, b = gevent.socket.socketpair()
    data = bytes(range(256)) * 16384          # 4 MiB: far over a socket pair's buffer
    got = bytearray()

    def slow_reader() -> None:
        while len(got) < len(data):
            gevent.sleep(0.001)
            got.extend(b.recv(65536))

    reader = gevent.spawn(slow_reader)
    sender(a)(data)
    reader.join(timeout=30)
    assert bytes(got) == data
    a.close()
    b.close()


def test_a_socket_that_is_not_a_plain_gevent_one_keeps_its_own_methods() -> None:
    a, b = socket.socketpair()                # the stdlib's: blocking, no OS socket below
    assert os_socket(a) is None
    assert sender(a) == a.sendall
    a.close()
    b.close()
