"""Every published draft-head checkpoint specnb plans for, by repository id: Medusa's
(`io.medusa_checkpoint.PUBLISHED`), then EAGLE's (`io.eagle_checkpoint.PUBLISHED`)."""

from __future__ import annotations

from .checkpoints import PublishedCheckpoint
from .eagle_checkpoint import PUBLISHED as EAGLE
from .medusa_checkpoint import PUBLISHED as MEDUSA


def published_checkpoints() -> dict[str, PublishedCheckpoint]:
    """Every published head checkpoint specnb plans for, by repository id."""
    return {**MEDUSA, **EAGLE}
