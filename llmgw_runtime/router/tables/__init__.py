"""The tables a router's gunicorn workers share, each a small file that ``serve.run`` makes
in the router's private directory before the workers fork and that every worker maps
(without gunicorn, this process's memory): ``slots.py``, the requests in flight at each
replica and waiting per model, and the lock every other table is read and written under;
``homes.py``, which replica served each prompt prefix last; ``limits.py``, the levels of
the per-key rpm and tpm limits; ``shm.py``, how such a file is made and mapped.
"""
