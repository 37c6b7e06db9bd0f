"""The HTTP text surfaces: stateless generate, application sessions (with
unary and streaming-input turns), resumable streams, request parsing and the
reasoning/tool-call scanners, behind one ``TextService``.

Beside ``session`` (neither imports the other); on top of the vLLM stage and
replay; below the host, which builds the service when a stage serves text.
"""
