"""The vLLM LLM stage: one ``AsyncLLM`` shared by every session, with a live
streaming-input request per session, the chat template, and the supervisor
that rebuilds a dead engine. The text surfaces run on the same engine.
"""
