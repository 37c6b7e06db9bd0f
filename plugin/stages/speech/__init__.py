"""Speech stages: text to audio as sentences complete (Flite, eSpeak NG run as
subprocesses), so the first audio follows the first sentence, not the reply.
"""
