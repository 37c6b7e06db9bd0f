"""Images inline in a request: ``data:image/...;base64,`` URLs.

Shared by the wire codec (which validates an ``input_image`` part where it
parses it) and the session (which decodes it); no session knowledge.
"""

from __future__ import annotations

import base64
import binascii

from vllm_duplex.domain.errors import DuplexError


def data_url_bytes(url: str, param: str = "image_url") -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL. Remote URLs are refused
    (``invalid_value``): the server fetches nothing on a client's behalf."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise DuplexError("invalid_value", f"{param} must be a data:image/...;base64 URL "
                          "(remote URLs are not fetched)", param=param)
    head, _, data = url.partition(",")
    if not head.endswith(";base64"):
        raise DuplexError("invalid_image", f"{param} must be base64 encoded", param=param)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise DuplexError("invalid_image", f"{param} is not valid base64", param=param) from None
