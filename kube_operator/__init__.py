"""cronoq-operator: sets each worker Deployment's replicas from its pool's desired capacity
(``CronoqWorkerScaler`` resources; ``docs/operator.md``).

Installed as ``cronoq.operator`` (the folder is not called ``operator``, which would shadow the standard
library's module). The decision is made without I/O (:mod:`.decision`, on :mod:`.scaler` specs and
:mod:`.readings`); the loop around it (:mod:`.reconciler`) reads the cronoq servers (:mod:`.servers`)
and the Kubernetes API (:mod:`.kube`), on the scalers the watch keeps current (:mod:`.inventory`), while
this replica leads (:mod:`.election`); :mod:`.metrics` serves its probes and ``/metrics``;
:mod:`.config` is its configuration file, :mod:`.main` the ``cronoq-operator`` command.
"""

from cronoq.grpc_settings import SERVER_VERBOSITY, load_grpc

load_grpc(SERVER_VERBOSITY)  # before any module of the operator imports grpc (through the SDK)
