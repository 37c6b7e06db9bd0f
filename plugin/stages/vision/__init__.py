"""Vision stages: what the camera shows — a scene analyzer (text by OCR, faces)
that describes sampled frames when the description changes.
"""
