"""The router's HTTP/1.1: the server that reads clients' requests (``server.py``), the client
that talks to the engines (``client.py``), both parsing with httptools (llhttp, the parser
uvicorn uses), and the relay loop that carries a streamed answer from an engine to its
client (``relay.py``: compiled when built, interpreted otherwise); both send on the OS
socket first (``rawsock.py``)."""
