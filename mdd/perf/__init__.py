"""Performance measurement: call replays, occupancy, the evaluation stage's throughput (used by ``jobs.benchmark``)."""
