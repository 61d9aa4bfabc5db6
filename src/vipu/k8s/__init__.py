"""Kubernetes integration: the IPUJob operator, the V-IPU proxy and the launcher's init program."""
