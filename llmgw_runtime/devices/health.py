"""Whether a card can be trusted with work: one pure rule for every device source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthFacts:
    """What a source read about one card; ``None`` means "not reported" (never "fine")."""

    retired_pages_pending: bool | None = None
    remap_failure: bool | None = None
    remap_pending: bool | None = None
    uncorrectable_ecc_volatile: int | None = None
    errors: tuple[str, ...] = ()     # NVML or parsing errors while reading this card


def health_reason(facts: HealthFacts) -> str | None:
    """None when healthy, else why the card must not be used (and what to do)."""
    reasons = []
    if facts.retired_pages_pending:
        reasons.append("retired pages are pending: reset the GPU (nvidia-smi -r) or reboot")
    if facts.remap_failure:
        reasons.append("row remapping failed: the card needs service")
    if facts.remap_pending:
        reasons.append("a row remap is pending: reset the GPU (nvidia-smi -r) or reboot")
    if facts.uncorrectable_ecc_volatile:
        reasons.append(f"{facts.uncorrectable_ecc_volatile} uncorrectable ECC errors since "
                       "the last reset: reset the GPU and watch for more")
    reasons.extend(facts.errors)
    return "; ".join(reasons) or None
