"""The fleet dashboard: live presence, latency percentiles, failures and firmware adoption."""
