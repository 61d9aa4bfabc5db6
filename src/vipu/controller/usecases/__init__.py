"""The controller's use cases, one service per kind of thing: what a servicer calls, in one call
per request. Partitions and waiting requests are asked of their allocation's owner
(`vipu.controller.core`) and read from its snapshots; the slow-changing configuration (agents,
clusters, allocations) and users are read and written through the store."""
