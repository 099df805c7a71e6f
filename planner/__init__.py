"""Capacity planning: a measured cost model (profile), a simulator that runs pdserve's own scheduler
over it (simulate), and a search that writes Helm values (plan)."""
