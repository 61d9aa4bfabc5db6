"""The client side of vipu-server's end-points, shared by every program that calls them.

The CLIs, `vipu-ipuof`, the Slurm programs and the Kubernetes proxy reach the controller through
this package: `settings` finds the controller and the caller's credentials (flags, environment,
configuration files, replica lists), `connection` makes the calls. Nothing here imports the CLIs.
"""
