"""The GPT-Live dialect (``/v1/live/sessions``): a sans-I/O codec over the same
session port and ``SessionCore`` as OpenAI Realtime (docs/live-conformance.md)."""
