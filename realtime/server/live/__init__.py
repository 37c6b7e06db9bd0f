"""The GPT-Live transport shells (``/v1/live/sessions``)."""
