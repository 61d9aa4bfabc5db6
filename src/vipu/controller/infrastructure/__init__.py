"""What the controller reaches beyond itself: agents over gRPC (`agentclient`), the agents'
announcements (`discovery`) and the other replicas through the store's lease (`leadership`)."""
