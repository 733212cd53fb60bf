"""The per-turn enrichment disable flags (R8): each restart sets its flag for the rest of the
turn, and tool availability and execution checks read them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

EnrichmentKind = Literal["message_metadata", "youtube", "image", "gif"]

ENRICHMENT_KINDS: tuple[EnrichmentKind, ...] = ("message_metadata", "youtube", "image", "gif")

FLAG_BY_KIND: dict[EnrichmentKind, str] = {
    "message_metadata": "disable_message_metadata_context",
    "youtube": "disable_youtube_processing",
    "image": "disable_profile_picture_processing",
    "gif": "disable_gif_processing",
}


@dataclass(slots=True)
class TurnFlags:
    """Fresh for every turn; set only by the restart transition."""

    disable_message_metadata_context: bool = False
    disable_youtube_processing: bool = False
    disable_profile_picture_processing: bool = False
    disable_gif_processing: bool = False

    def is_disabled(self, kind: EnrichmentKind) -> bool:
        return bool(getattr(self, FLAG_BY_KIND[kind]))

    def disable(self, kind: EnrichmentKind) -> None:
        setattr(self, FLAG_BY_KIND[kind], True)

    def as_dict(self) -> dict[str, bool]:
        return asdict(self)
