"""The chaos suite cronoq runs on itself (``make chaos``; docs/operations.md, "Chaos runs").

``make cluster``'s topology under faults drawn from a seed (:mod:`.schedule`), injected by the harness
(:mod:`.harness`, :mod:`.cluster`, :mod:`.proxy`) while producers (:mod:`.producer`) and the SDK's
workers (:mod:`.worker`) do real work and a watcher (:mod:`.watch`) follows leadership; everything any
of them saw goes into a history (:mod:`.history`), which an independent checker (:mod:`.checker`)
judges afterwards, and a report (:mod:`.report`) sums up. :mod:`.broken` runs it all on a build broken
on purpose, to show the checker catches it.
"""
