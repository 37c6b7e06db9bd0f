"""Leases: the ``SessionManager`` — admission (per server and per API key),
leases with TTL, renew and compare-and-swap generations, tombstones that tell
"expired" from "unknown", the reaper, and the instance id that owns a session
— and the ``Registry`` under it (ids, per-key ownership, tombstones, the
reaper), which the text surfaces' resumable streams build on too.

Generic over what it holds (realtime sessions, application sessions), so it
sits low, beside replay and media: it imports only the core.
"""
