"""Prometheus metrics of one daemon: the collector, p2pd's network bytes, and the /metrics endpoint extension."""
