"""The cluster: how any process of a sharded cronoq finds where a call belongs and gets it there.

Read in this order:

- :mod:`.shards`: **who owns what.** ``[[shards]]`` gives each pool (and each ``[[resources]]`` entry) to
  one shard; every process reads the same map (:class:`~.shards.ShardMap`), so any of them can tell a
  call's shard by the pool it names or by the shard number in the top 8 bits of a task id, without
  asking anyone. :class:`~.shards.WrongShard` is the refusal that names the owner instead.
- :mod:`.discovery`: **where a shard's leader is.** A shard is a leader and standbys; with ``members``
  listed, every router and sharded server polls their gRPC health and sends the shard's calls to the
  one that serves (:class:`~.discovery.LeaderFinder`).
- :mod:`.forward`: **how a call reaches its shard.** :class:`~.forward.Peers` forwards a caller's call to
  the owner's leader with the caller's own credential and the ``cronoq-forwarded`` marker (the owner
  authenticates it again and never forwards it on), retries what cannot run twice, and refuses
  (``WrongShard``) what must not travel: a call forwarded already, a certificate caller, a token over
  plain http to another host.
- :mod:`.routing`: **the decisions**, the same in a router and in a shard server (which answers its own
  shard's calls itself): by pool, by id, by key (keys are one namespace across the cluster, so a key is
  looked up on every shard and a submission's key checked on the others), and the fan-outs.
- :mod:`.fanout`: **merging** what every shard answered to a listing, a snapshot or a watch, naming the
  shards that could not be reached.

Workers are never forwarded: registering for another shard's pool is refused with ``WrongShard``'s
metadata (``cronoq-shard``, ``cronoq-shard-endpoint`` and every URL of that shard), and SDK workers
reconnect to that shard, following only URLs the cluster names (``cronoq.client``).

The package imports the configuration, auth, errors and ``cronoq.transport``, never the SDK
(``cronoq.client``), the API transports (``cronoq.api``) or the engine; both servers (``cronoq.shard``,
``cronoq.router``) build on it.
"""
