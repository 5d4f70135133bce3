"""Nodes: several service processes on one database (heartbeats, leases, marking down) and the adoption of a down node's
sessions."""
