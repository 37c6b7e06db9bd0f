"""Speech stages: a reply's text to audio piece by piece as it streams in
(``streaming_tts.py``; the cutting is ``pieces.py``) -- Piper (``piper.py``),
or Flite / eSpeak NG run as subprocesses (``subprocess_tts.py``) -- so the
first audio follows the reply's first words, not the whole reply.
"""
