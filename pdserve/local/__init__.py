"""The local cluster: `pdserve up` (processes on 127.0.0.1, or pods: a network namespace, a DNS
name and a CPU limit each), its DNS registry, and `pdserve scale` with its control endpoint."""
