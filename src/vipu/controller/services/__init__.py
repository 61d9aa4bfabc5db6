"""Use-case services: one function per use case, over the store and the agents."""
