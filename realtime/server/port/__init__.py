"""The one session port every transport stands on (``session_port``) and the
calls over it (``calls``): a transport writes only its wire."""
