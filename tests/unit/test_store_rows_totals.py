"""The engine's totals as a commit keeps them (shard.store.rows): every counter by name, in compact JSON
that versions which count more or fewer counters read back."""

from __future__ import annotations

import dataclasses
import json

from cronoq.engine.snapshot import Totals
from shard.store.rows import totals_from_text, totals_text


def test_every_counter_is_kept_by_name_and_read_back() -> None:
    names = [f.name for f in dataclasses.fields(Totals)]
    totals = Totals(**{name: i + 1 for i, name in enumerate(names)})
    kept = totals_text(totals)
    assert json.loads(kept) == {name: i + 1 for i, name in enumerate(names)}
    assert " " not in kept  # compact: it is written at every commit
    assert totals_from_text(kept) == totals
