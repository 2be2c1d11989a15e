"""The scheduling engine: a deterministic, sans-IO state machine shared by the server and library mode.

Inputs (submit, cancel, worker capacity, attempt outcomes, heartbeats, ``tick(now)``) go in; actions
(dispatch a lease, abort a lease, status events) come out of ``take_actions()``. Nothing here does I/O
or reads a clock, so every rule is tested in microseconds with injected time.
"""
