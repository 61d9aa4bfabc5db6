"""Options of the channels vipu keeps open to its servers (controller to agents, proxy to controller).

gRPC backs off reconnecting to an unreachable server exponentially, up to 120 s by default, and
fails calls at once while it waits. A long-lived client would then see a server that came back
as unreachable for up to two minutes. Capped at 2 s, a returning agent or controller is reached
within about 2 s, for a connection attempt every 2 s to one that stays away.
"""

RECONNECT_PROMPTLY = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 2000)]

# The call metadata that carries a highly available controller's lease term (its epoch) to its
# agents, which refuse a call of an older one than they have obeyed (`vipu.agent.holds`).
LEADER_EPOCH_KEY = "vipu-leader-epoch"
