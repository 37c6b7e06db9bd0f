"""WebRTC calls (``POST /v1/realtime/calls``): a thin I/O shell over the same codec and session core as the WebSocket."""
