"""Shortest-job-first against fcfs: step counts and wall-clock latency."""
