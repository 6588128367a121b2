"""The Hugging Face architectures `seqserve import` reads, by config.json's model_type: the one table of them
(torch-free, so `seqserve --help` lists them without loading torch)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """How one model_type differs from the original Transformer (DESIGN: "Pretrained encoder-decoders")."""

    positions: str
    position_offset: int
    norm_first: bool  # pre-LN with a final LayerNorm on each stack (mBART, M2M100)
    embed_norm: bool  # layernorm_embedding
    offset_after_pad: bool = False  # position 0 is row pad_token_id + 1 (fairseq's make_positions: M2M100, NLLB)
    models: str = ""  # the model families published under this model_type, as users know them
    layout: str = "bart"  # config.json's keys and weight names: BART's (fairseq's) or T5's (model/hf_t5.py)

    @property
    def legacy(self) -> dict[str, bool]:
        """Switches older config.json files carry (transformers 3's): the value this family's class implements."""
        return {"static_position_embeddings": self.positions != "learned", "normalize_embedding": self.embed_norm,
                "normalize_before": self.norm_first, "add_final_layer_norm": self.norm_first,
                "add_bias_logits": False}


FAMILIES = {
    "marian": Family("sinusoidal_halves", 0, norm_first=False, embed_norm=False, models="Marian, opus-mt"),
    "bart": Family("learned", 2, norm_first=False, embed_norm=True, models="BART"),
    "mbart": Family("learned", 2, norm_first=True, embed_norm=True, models="mBART, mBART-50"),
    "m2m_100": Family("sinusoidal_fairseq", 0, norm_first=True, embed_norm=False, offset_after_pad=True,
                      models="M2M100, NLLB"),
    "t5": Family("relative", 0, norm_first=True, embed_norm=False, models="T5, T5 v1.1, Flan-T5", layout="t5"),
    "mt5": Family("relative", 0, norm_first=True, embed_norm=False, models="mT5", layout="t5"),
}
# model_types refused by name, with the reason
REFUSED = {"umt5": "UMT5 has a relative position bias in every layer; seqserve's T5 shares one per stack (t5, mt5)"}


def described() -> str:
    """Every model_type with the families it covers: `marian (Marian, opus-mt), ..., m2m_100 (M2M100, NLLB)`."""
    return ", ".join(f"{name} ({family.models})" for name, family in FAMILIES.items())
