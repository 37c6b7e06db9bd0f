"""Reading one sample from a ``/metrics`` scrape (Prometheus text format)."""

from __future__ import annotations

import re


def metric(text: str, name: str, **labels: str) -> float:
    """The value of ``name{labels}`` (labels in the order given); fails if absent."""
    label = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}{re.escape('{' + label + '}') if label else ''} (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, (name, labels)
    return float(found.group(1))
