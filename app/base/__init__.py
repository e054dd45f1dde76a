"""The shared base every layer may use: domain errors, the greenlet/thread bridge, the request
context, metrics, the load state, and what a worker inherits from the master."""
