"""cronoq-router: a stateless front that forwards calls to the leader of the shard that owns them."""
