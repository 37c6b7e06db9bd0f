"""Phone calls into realtime sessions (docs/telephony.md)."""
