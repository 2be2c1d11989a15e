"""The shared read-only empty ``resources`` mapping of task specs.

It lives apart from ``model`` because ``model`` is compiled with mypyc, and a compiled subclass of
``dict`` does not let methods assigned in its body replace the ``dict`` ones: only an interpreted class
can refuse the mutators. Keep this module out of the compiled set (``setup.py``).
"""

from __future__ import annotations


class _NoResources(dict[str, int]):
    """The one empty, read-only ``resources`` every spec without resources shares.

    Almost no task names resources; a fresh empty dict per task would be one more object per task
    that the dispatch path touches (to see that it is empty), which measurably slows the engine. A dict
    subclass keeps the truth test and lookups at C speed; hashable so a dataclass accepts it as a
    default; every mutator refuses.
    """

    __slots__ = ()
    __hash__ = object.__hash__  # type: ignore[assignment]

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("the shared empty resources of a TaskSpec cannot be changed; assign a new dict")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]


NO_RESOURCES: dict[str, int] = _NoResources()
