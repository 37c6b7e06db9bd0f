"""The host: what one server process shares — the ``Runtime`` (deploy config,
the stages with one engine for all sessions, the policy, the session manager,
clock and metrics), deployment configs, their worker topology, and the
registry of stage types.

At the top of the product layers (below only ``realtime`` and ``fleet``): it
wires sessions, text surfaces, stages and leases together, so none of them
needs to know the others.
"""
