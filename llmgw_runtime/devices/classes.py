"""Device classes: card model and memory, lower case (``a100-80g``, ``h100-80g``,
``rtx4090-24g``); a MIG instance appends its profile (``a100-80g-mig-3g.40gb``)."""

from __future__ import annotations

import re

# Marketing sizes in GB; a card's MiB total is rounded to the nearest within 10 %.
NOMINAL_GB = (2, 4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 180, 192,
              288)
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro"}
_JOINED = {"rtx", "gtx", "titan"}


def nominal_gb(memory_total_mb: int) -> int:
    """80 for 81559 MiB, 16 for a T4's 15360 MiB, 141 for an H200's 143771 MiB."""
    gib = memory_total_mb / 1024.0
    best = min(NOMINAL_GB, key=lambda n: abs(n - gib))
    if abs(best - gib) <= 0.1 * best:
        return best
    return max(1, round(gib))


def model_slug(product_name: str) -> str:
    """``NVIDIA A100-SXM4-80GB`` -> ``a100``; ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``."""
    words = [w for w in re.split(r"[\s_]+", product_name.strip().lower()) if w]
    words = [w for w in words if w not in _VENDOR_WORDS]
    if not words:
        return "gpu"
    first = words[0].split("-")[0]
    if first in _JOINED and len(words) > 1:
        first += words[1].split("-")[0]
    return re.sub(r"[^a-z0-9.]", "", first) or "gpu"


def gpu_class(product_name: str, memory_total_mb: int) -> str:
    return f"{model_slug(product_name)}-{nominal_gb(memory_total_mb)}g"


def mig_class(card_class: str, profile: str) -> str:
    """``a100-80g`` + ``3g.40gb`` -> ``a100-80g-mig-3g.40gb``."""
    return f"{card_class}-mig-{profile.strip().lower()}"
