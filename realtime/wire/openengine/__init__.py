"""OpenEngine protocol stubs (generated: scripts/gen_protos.py)."""
