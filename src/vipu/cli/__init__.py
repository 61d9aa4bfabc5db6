"""The command-line clients.

gRPC's C core logs to standard error on its own (a busy port, a failed TLS handshake); vipu says
what went wrong itself, in one line. The setting must precede the first import of grpc, which
this package's modules make, so it lives here.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
