"""Admission: a request gets a free slot of one of its model's replicas before it is
forwarded, waits for one in a bounded queue fair across API keys, or is refused with a
429. ``core.py`` is the pure core that decides (:class:`~.core.Admission`: Admitted,
Queued or Rejected; no clock, no I/O), with ``queue.py``, the order in which waiting
requests are served, and ``affinity.py``, which replica a prompt prefix belongs to.
``gate.py`` is the waiting shell each worker runs around the cores (:class:`~.gate.Gate`:
the shared slot counts' lock, the wait, the slot's :class:`~.gate.Lease`, the load
reported to the control service), and ``gone.py`` tells it that a waiting request's
client went away.
"""
