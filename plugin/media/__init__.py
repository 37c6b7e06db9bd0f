"""Media: audio codecs and resampling (PCM16, G.711 µ-law/A-law) and video
decoding (images, WebM/MP4 chunks) with frame sampling and rate limits.

Pure functions and small decoders with no session or stage knowledge, so
sessions, stages and the wire layer can all use them; imports only the core.
"""
