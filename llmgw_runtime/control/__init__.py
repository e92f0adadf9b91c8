"""The control service: the only writer of desired state."""
