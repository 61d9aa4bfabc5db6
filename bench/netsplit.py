"""Network partitions between the controller's replicas and PostgreSQL, made in a network namespace
of the campaign's own.

PostgreSQL runs in the namespace; each replica reaches it over a veth link of its own (and the
campaign over one more). Cutting a link adds a blackhole route at each end, for the other end's
address: nothing passes either way and nothing is answered, as in a real partition (a statement
sent just before may have been carried out, its answer lost). The connections open then hang
rather than fail; a new one is refused at once on the replica's side (the kernel's answer to a
blackhole route for what the host itself sends), where a real partition would leave it to time
out. Healing removes the routes, and the connections that held on carry on.

Needs `ip` and the right to make namespaces (root); `possible()` says whether this machine gives it.
"""

from __future__ import annotations

import random
import secrets
import subprocess


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def possible() -> bool:
    """Whether network namespaces can be made here."""
    name = f"vipu-try-{secrets.token_hex(3)}"
    try:
        ip("netns", "add", name)
    except (OSError, subprocess.SubprocessError):
        return False
    ip("netns", "delete", name)
    return True


class Links:
    """A namespace holding PostgreSQL and `count` links into it, numbered from 0."""

    def __init__(self, count: int):
        tag = secrets.token_hex(3)
        self.namespace = f"vipu-pg-{tag}"
        self._subnet = f"10.{random.randrange(64, 192)}"  # one /30 per link: 10.S.N.1 outside, 10.S.N.2 inside
        ip("netns", "add", self.namespace)
        try:
            ip("-n", self.namespace, "link", "set", "lo", "up")
            for number in range(count):
                outside, inside = f"vo{tag}{number}", f"vi{tag}{number}"
                ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", self.namespace)
                ip("addr", "add", f"{self._subnet}.{number}.1/30", "dev", outside)
                ip("link", "set", outside, "up")
                ip("-n", self.namespace, "addr", "add", f"{self._subnet}.{number}.2/30", "dev", inside)
                ip("-n", self.namespace, "link", "set", inside, "up")
        except BaseException:
            self.close()
            raise

    def address(self, link: int) -> str:
        """PostgreSQL's address over `link`."""
        return f"{self._subnet}.{link}.2"

    def cut(self, link: int) -> None:
        ip("-n", self.namespace, "route", "add", "blackhole", f"{self._subnet}.{link}.1/32")
        ip("route", "add", "blackhole", f"{self._subnet}.{link}.2/32")

    def heal(self, link: int) -> None:
        ip("route", "delete", "blackhole", f"{self._subnet}.{link}.2/32")
        ip("-n", self.namespace, "route", "delete", "blackhole", f"{self._subnet}.{link}.1/32")

    def close(self) -> None:
        """Delete the namespace: its ends of the links go with it, and so the links and their routes."""
        subprocess.run(["ip", "netns", "delete", self.namespace], capture_output=True, timeout=30)
