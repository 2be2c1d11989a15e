"""The loopback ports the tests give their servers."""

from __future__ import annotations

from tests.ports import free_ports


def test_no_port_is_handed_out_twice_in_a_row_of_calls() -> None:
    """A test may pick ports for several servers in separate calls before any of them binds (a router
    made before the shards it fronts start): no call may return a port an earlier one did. 1,000 ports
    drawn from 12,000 would repeat about 40 times if each call drew independently."""
    picked = [port for _ in range(20) for port in free_ports(50)]
    assert len(set(picked)) == len(picked)
    assert all(20_000 <= port < 32_000 for port in picked)
