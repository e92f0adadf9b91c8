"""What the router does for every piece of an engine's answer, in one module that Cython
compiles (``setup.py`` builds it as ``_crelay``; ``relay.py`` picks one): the answer read
with httptools (llhttp) as it arrives, and a streamed answer carried to its client.

- :class:`Reader`: one answer's head and body through ``httptools.HttpResponseParser``,
  held to the router's bounds: a head of at most :data:`MAX_HEAD` bytes (counted exactly:
  the parser is never given more than that before the head ends) and :data:`MAX_HEADERS`
  fields; an engine's ``101`` is refused (the router speaks no other protocol), other
  interim ``1xx`` answers are skipped; bytes after the answer mark the connection as not
  to be reused. Anything llhttp refuses (two lengths, a bad chunk, control bytes) raises
  :class:`Malformed` with llhttp's reason.
- :func:`next_piece`: the next decoded piece of a body, waiting on the connection (each
  wait has the connection's idle limit, restarted on every byte: a stream that keeps
  sending is never cut).
- :func:`relay`: a streamed answer carried to the client: decoded, passed through the
  usage scan, framed for the client and sent on the OS socket, one loop per piece with no
  Python frame between the engine's bytes and the client's but the scan's.
"""

from __future__ import annotations

from typing import Any

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpResponseParser,
)

MAX_HEAD = 65536          # bytes of an answer's status line and header fields
MAX_HEADERS = 100
TERMINATOR = b"0\r\n\r\n"


class Malformed(Exception):
    """The engine's answer is not HTTP/1.1 as the router reads it."""


class Closed(Exception):
    """The engine closed the connection before its answer was complete."""


class Reader:
    """One answer through httptools; ``pieces`` gathers the decoded body as it arrives."""

    def __init__(self) -> None:
        self.parser = HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.fields: dict[str, str] = {}
        self.pieces: list[bytes] = []
        self.head_done = False
        self.done = False
        self.keep = False
        self.extra = False          # bytes after the answer: the connection is not reused
        self.error: Malformed | None = None   # the body broke after these pieces
        self._fed = 0               # bytes given to the parser before the head ended
        self._interim = False

    # -- httptools' callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise Malformed(f"the answer has more than {MAX_HEADERS} header fields")
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        self.headers.append((key, text))
        low = key.lower()
        fields = self.fields
        fields[low] = f"{fields[low]}, {text}" if low in fields else text

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status == 101:
            raise Malformed("the engine answered 101 Switching Protocols, which the router "
                            "does not speak")
        if status < 200:                     # 100, 102, 103: an interim answer, skipped
            self._interim = True
            self.headers = []
            self.fields = {}
            return
        self.status = status
        self.keep = self.parser.should_keep_alive()
        self.head_done = True

    def on_body(self, data: bytes) -> None:
        self.pieces.append(data)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        else:
            self.done = True

    # -- feeding ----------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Give the parser what arrived (the head's bound is exact: at most
        :data:`MAX_HEAD` bytes reach it before the head ends)."""
        if self.done or self.error is not None:
            self.extra = True
            return
        if not self.head_done:
            room = MAX_HEAD - self._fed
            if len(data) > room:
                self._feed(data[:room])
                self._fed = MAX_HEAD
                if not self.head_done:
                    raise Malformed(f"the answer's head is over {MAX_HEAD} bytes")
                data = data[room:]
            else:
                self._fed += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except HttpParserCallbackError as exc:
            cause = exc.__context__
            raise cause if isinstance(cause, Malformed) else Malformed(str(exc)) from None
        except HttpParserUpgrade:
            raise Malformed("the engine answered with a protocol upgrade") from None
        except HttpParserError as exc:
            if self.done:                    # what follows the answer is not the router's
                self.extra = True
                return
            error = Malformed(f"the answer is malformed: {exc}")
            if not self.head_done:
                raise error from None
            self.error = error               # raised once the pieces before it are taken

    def at_close(self) -> bool:
        """The engine closed the connection: whether that ends the answer (a body with
        neither a length nor chunks ends at the close)."""
        if self.done:
            return True
        if self.head_done and "content-length" not in self.fields and \
                self.fields.get("transfer-encoding", "").lower().rpartition(",")[2].strip() \
                != "chunked":
            self.done = True
        return self.done

    def take(self) -> bytes:
        pieces = self.pieces
        if len(pieces) == 1:
            data = pieces[0]
        else:
            data = b"".join(pieces)
        pieces.clear()
        return data


def next_piece(link: Any, reader: Reader) -> bytes | None:
    """The next decoded piece of the answer's body, None at its end. Raises Closed,
    Malformed, TimeoutError (no byte for the connection's idle limit) or OSError."""
    while True:
        if reader.pieces:
            data = reader.take()
            if data:
                return data
        if reader.error is not None:
            raise reader.error
        if reader.done:
            return None
        got = link.read()
        if not got:
            if reader.at_close():
                continue
            raise Closed("the engine closed the connection mid-answer")
        reader.feed(got)


class Outgoing:
    """What the client is sent for an answer's pieces: each through the usage ``scan``
    (or None), which says what to pass on; ``first_byte`` (or None) called once, before
    the first byte goes out; chunk-framed when ``chunked``; ``head`` (or None) before the
    first bytes; at the end what the scan held back, and the terminator when chunked.
    One for :func:`relay`, :class:`Pump` and a stream the server iterates."""

    def __init__(self, head: bytes | None, chunked: bool, scan: Any, first_byte: Any) -> None:
        self.pending = head
        self.chunked = chunked
        self.scan = scan
        self.first_byte = first_byte

    def piece(self, data: bytes) -> bytes:
        if self.scan is not None:
            data = self.scan.feed(data)
            if not data:
                return b""
        return self._out(data)

    def end(self) -> bytes:
        tail = self.scan.end() if self.scan is not None else b""
        out = self._out(tail) if tail else b""
        if self.chunked:
            out += TERMINATOR
        if self.pending is not None:
            out = self.pending + out
            self.pending = None
        return out

    def _out(self, data: bytes) -> bytes:
        if self.first_byte is not None:
            self.first_byte()
            self.first_byte = None
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        if self.pending is not None:
            data = self.pending + data
            self.pending = None
        return data


def relay(link: Any, reader: Reader, send: Any, head: bytes, chunked: bool, scan: Any,
          first_byte: Any) -> None:
    """Carry the rest of the answer to the client: ``send`` (all of its bytes to the
    client) gets what :class:`Outgoing` makes of each piece as it comes, and of the end.
    Raises Closed or Malformed when the engine's answer broke (the caller ends the
    client's connection without the terminator), OSError when the client went away."""
    outgoing = Outgoing(head, chunked, scan, first_byte)
    while True:
        try:
            data = next_piece(link, reader)
        except OSError as exc:           # the engine's side (the client's raises from send)
            raise Closed(f"{type(exc).__name__}: {exc}") from None
        if data is None:
            break
        out = outgoing.piece(data)
        if out:
            send(out)
    out = outgoing.end()
    if out:
        send(out)


class ClientStalled(OSError):
    """The client read nothing of its answer for the idle limit."""


def pump(hub: Any, up: Any, reader: Reader, client: Any, head: bytes, chunked: bool,
         scan: Any, first_byte: Any, idle_s: float) -> None:
    """What :func:`relay` does, on the event loop's own callbacks: ``up`` and ``client``
    are the two non-blocking OS sockets. Each piece the engine sends is read, decoded,
    scanned, framed and sent within one callback of the loop, with no switch to the
    request's greenlet and back (two switches a piece, a sixth of a relayed piece's CPU:
    docs/performance.md); the request's greenlet waits once, for the end. A client that
    cannot take a piece at once has it sent when its socket can, the engine's socket
    unread meanwhile. Raises as :func:`relay` does; ClientStalled (an OSError) when the
    client took nothing for ``idle_s``."""
    Pump(hub, up, reader, client, head, chunked, scan, first_byte, idle_s).run()


class Pump:
    """One stream carried by :func:`pump`."""

    def __init__(self, hub: Any, up: Any, reader: Reader, client: Any, head: bytes,
                 chunked: bool, scan: Any, first_byte: Any, idle_s: float) -> None:
        self.hub = hub
        self.up = up
        self.reader = reader
        self.client = client
        self.outgoing = Outgoing(head, chunked, scan, first_byte)
        self.idle_s = idle_s
        self.finished = False
        self.backlog: bytes | None = None
        self.waiter: Any = None
        self.read_io: Any = None
        self.write_io: Any = None
        self.timer: Any = None
        self.now: Any = hub.loop.now     # the loop's time of its current turn (no syscall)
        self.last = 0.0                  # the loop's time of the last progress

    def run(self) -> None:
        out = self.collect()
        if out:
            self.send(out)
        if self.finished and self.backlog is None:
            return
        from gevent.hub import Waiter
        loop = self.hub.loop
        self.waiter = Waiter(self.hub)
        self.read_io = loop.io(self.up.fileno(), 1)
        self.write_io = loop.io(self.client.fileno(), 2)
        self.timer = loop.timer(self.idle_s)
        self.last = self.now()
        try:
            if self.backlog is None:
                self.read_io.start(self.on_readable)
            else:
                self.write_io.start(self.on_writable)
            self.timer.start(self.on_idle)
            self.waiter.get()
        finally:
            self.read_io.close()
            self.write_io.close()
            self.timer.close()

    def collect(self) -> bytes:
        """The bytes to send for what the reader holds (the head before the first)."""
        reader = self.reader
        out = b""
        if reader.pieces:
            data = reader.take()
            if data:
                out = self.outgoing.piece(data)
        if reader.error is not None:
            raise reader.error
        if reader.done:
            out += self.outgoing.end()
            self.finished = True
        return out

    def send(self, out: bytes) -> None:
        """Send what the client's socket takes now; the rest waits for it (the engine's
        socket unread meanwhile)."""
        try:
            sent = self.client.send(out)
        except BlockingIOError:
            sent = 0
        if sent < len(out):
            self.backlog = out[sent:]
            if self.read_io is not None:
                self.read_io.stop()
                self.write_io.start(self.on_writable)

    def on_readable(self) -> None:
        try:
            try:
                got = self.up.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                raise Closed(f"{type(exc).__name__}: {exc}") from None
            reader = self.reader
            if got:
                reader.feed(got)
            elif not reader.at_close():
                raise Closed("the engine closed the connection mid-answer")
            out = self.collect()
            if out:
                self.send(out)
            if self.finished and self.backlog is None:
                self.end(None)
            else:
                self.last = self.now()
        except BaseException as exc:
            self.end(exc)

    def on_writable(self) -> None:
        try:
            backlog = self.backlog or b""
            self.backlog = None
            self.write_io.stop()
            self.send(backlog)
            if self.backlog is None:
                if self.finished:
                    self.end(None)
                    return
                self.read_io.start(self.on_readable)
            self.last = self.now()
        except BaseException as exc:
            self.end(exc)

    def on_idle(self) -> None:
        """The idle timer, armed once for the whole limit: progress only notes the loop's
        time (restarting a libev timer on every piece cost about 10 us a piece, a third of
        the relay's CPU); when it fires early for that, it is armed again for what is
        left."""
        left = self.last + self.idle_s - self.now()
        if left > 0:
            self.timer.close()
            self.timer = self.hub.loop.timer(left)
            self.timer.start(self.on_idle)
            return
        if self.backlog is not None:
            self.end(ClientStalled(f"the client read nothing for {self.idle_s:g} s"))
        else:
            self.end(Closed(f"no data from the engine for {self.idle_s:g} s"))

    def end(self, exc: BaseException | None) -> None:
        self.read_io.stop()
        self.write_io.stop()
        self.timer.stop()
        if exc is None:
            self.waiter.switch(None)
        else:
            self.waiter.throw(exc)
