"""Fakes for tests of the control plane: scripted stages (an LLM that always
says the same words, a tone TTS, a scripted omni model) and a virtual clock.

Registered as stage types by entry points so configs can name them, but never
imported by product code (an import-linter contract fails the suite if it
is); only tests, benchmarks and the scripted demo config use it.
"""
