"""The bus between replicas (docs/DESIGN.md "Many daemons"): it only wakes — the store is
the truth. :mod:`bridge.bus.base` has the seam and the single-daemon bus;
:mod:`bridge.bus.redis` the Redis one."""
