"""Children of the tests that do not outlive them."""

from __future__ import annotations

from collections.abc import Sequence


def dying_with_parent(command: Sequence[str], signal: str = "TERM", user: str | None = None) -> list[str]:
    """The command, made to receive SIGTERM (or `signal`) when the test process dies, even if it is killed;
    run as `user` if named (in the same setpriv: the kernel forgets the signal when a process changes user).

    setpriv sets PR_SET_PDEATHSIG and then execs the command. A preexec_fn could do the same but
    would make Python fork instead of vfork, and since grpcio 1.81 the forked child of a process
    holding gRPC channels may crash before it execs (grpc/grpc#43055): that killed a restarted
    vipu-server now and then.
    """
    as_user = ["--reuid", user, "--regid", user, "--init-groups"] if user else []
    return ["setpriv", *as_user, "--pdeathsig", signal, "--", *command]
