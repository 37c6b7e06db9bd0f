"""The OpenEngine gRPC surface (proto/openengine/v1): a third thin shell over
the text surfaces of ``vllm_duplex.text``, beside the HTTP routes and the
WebSocket, on the same runtime and the same sessions."""
