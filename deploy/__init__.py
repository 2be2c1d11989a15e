"""Running cronoq as it is deployed: ``image/`` holds the container image's default configuration,
:mod:`deploy.cluster` is ``make cluster`` (compose/'s development cluster on this machine)."""
