"""Listening stages: what the user said — voice activity (energy VAD, Silero
VAD) and speech recognition (PocketSphinx), on worker threads with one serial
worker per session (``base``). Their outputs are observations the fence gate
never drops, so cancelling aborts nothing here.
"""
