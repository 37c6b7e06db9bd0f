"""Stages: VAD, ASR, LLM, TTS, video, and the pipeline that chains them."""
