"""Fixed-start reservations of one pool.

A fixed-start task reserves [start - tolerance, start + duration estimate + tolerance]. A pool accepts
at most ``limit`` = max(1, floor(max x reservable_fraction)) reservations overlapping at any instant, so
capacity promised to fixed starts never exceeds what the pool can hold aside for them; one more is a
``reservation_conflict`` at submission. A reservation lasts until its task ends or its window closes.
Fixed starts are rare next to ordinary tasks, so a plain scan is the right structure.
"""

from __future__ import annotations

import math

Window = tuple[float, float]  # (from, to), Unix seconds


def reservation_limit(max_workers: int, reservable_fraction: float) -> int:
    """How many reservations of a pool may overlap."""
    return max(1, math.floor(max_workers * reservable_fraction))


def peak_overlap(windows: list[Window], lo: float, hi: float) -> int:
    """The most of ``windows`` that overlap at one instant within [lo, hi] (touching ends do not)."""
    points: list[tuple[float, int]] = []
    for start, end in windows:
        if start < hi and lo < end:
            points.append((max(start, lo), 1))
            points.append((min(end, hi), -1))
    points.sort()  # at equal times an end (-1) sorts before a start (+1): touching windows do not overlap
    depth = peak = 0
    for _, step in points:
        depth += step
        peak = max(peak, depth)
    return peak


class Reservations:
    """The reservations of one pool, by task id."""

    __slots__ = ("limit", "windows")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.windows: dict[int, Window] = {}

    def fits(self, window: Window, planned: list[Window]) -> bool:
        """Whether ``window`` can be reserved next to the current reservations and ``planned`` ones (the
        earlier fixed starts of the same batch)."""
        lo, hi = window
        return peak_overlap([*self.windows.values(), *planned], lo, hi) < self.limit

    def add(self, task_id: int, window: Window) -> None:
        self.windows[task_id] = window

    def remove(self, task_id: int) -> None:
        self.windows.pop(task_id, None)

    def active(self, now: float) -> int:
        """Reservations whose window has not closed (the snapshot's ``reservations``); closed ones are
        dropped on the way."""
        closed = [task_id for task_id, (_, end) in self.windows.items() if end < now]
        for task_id in closed:
            del self.windows[task_id]
        return len(self.windows)

    def peak_ahead(self, now: float, horizon: float, waiting: set[int]) -> int:
        """The peak overlap within [now, now + horizon] of the reservations of ``waiting`` tasks (fixed
        starts not started yet): capacity the autoscaler must provide on top of the backlog."""
        windows = [window for task_id, window in self.windows.items() if task_id in waiting]
        return peak_overlap(windows, now, now + horizon)
