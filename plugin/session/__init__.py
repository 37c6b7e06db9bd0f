"""One realtime session: the runner (the session's single writer), its mailbox
with a control lane that overtakes audio, responses, the input audio buffer
and video input.

Above stages, policy and replay, which it drives; beside ``text`` and never
importing it; below the host, which opens sessions through the lease manager.
"""
