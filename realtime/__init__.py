"""The wire and its ends: the OpenAI-Realtime-compatible protocol (``wire``,
sans-I/O), the ASGI server with the realtime socket and the HTTP routes
(``server``), and the clients (``client``).

Below only the CLI: it uses the host and everything below it; inside,
``client`` > ``server`` > ``wire`` (an import-linter contract).
"""
