"""The encoder-decoder Transformer of "Attention Is All You Need", split into encode() and decode().

encode() runs once per source; cross_kv() projects its output into every decoder layer's cross-attention
keys/values once; decode() runs any number of new target positions against a self-attention KV cache.
That split is exactly the ONNX export's encoder.onnx / decoder.onnx.
"""
from __future__ import annotations

import torch
from torch import nn

from seqserve.model.attention import causal_bias, padding_bias
from seqserve.model.config import LN_EPSILON, ModelConfig
from seqserve.model.layers import KV, DecoderLayer, EncoderLayer
from seqserve.model.norm import make_norm
from seqserve.model.positional import PositionalEncoding
from seqserve.model.relative_position import RelativePositionBias


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.tgt_embed = self.src_embed if cfg.tie_embeddings else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = self._positions()  # the encoder's
        # A sinusoid table is one fixed buffer for both stacks; learned tables are each stack's own (BART).
        self.tgt_positions = self._positions() if cfg.positions == "learned" else self.positions
        self.src_embed_norm = self._norm(cfg.embed_norm)  # BART: LayerNorm(embedding + position)
        self.tgt_embed_norm = self._norm(cfg.embed_norm)
        self.dropout = nn.Dropout(cfg.dropout)
        # T5: one relative position bias per stack, shared by its layers (bidirectional / unidirectional)
        self.enc_relative = self._relative(True)
        self.dec_relative = self._relative(False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so it needs a final LayerNorm on each stack.
        self.enc_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()
        self.dec_norm = make_norm(cfg) if cfg.norm_first else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.final_logits_bias:  # a buffer, as in HF: saved with the weights, never trained
            self.register_buffer("final_logits_bias", torch.zeros(cfg.vocab_size))  # (V,)
        else:
            self.final_logits_bias = None
        if cfg.tie_output:
            self.out_proj.weight = self.tgt_embed.weight  # shared pre-softmax and embedding weights (3.4)
        self._init_weights()

    def _positions(self) -> PositionalEncoding:
        cfg = self.cfg
        return PositionalEncoding(cfg.max_positions, cfg.d_model, cfg.positions, cfg.position_offset,
                                  cfg.scale_embeddings)

    def _relative(self, bidirectional: bool) -> RelativePositionBias | None:
        cfg = self.cfg
        if cfg.positions != "relative":
            return None
        return RelativePositionBias(cfg.n_heads, cfg.relative_buckets, cfg.relative_max_distance, bidirectional,
                                    cfg.max_positions)

    def _norm(self, wanted: bool) -> nn.Module:
        return nn.LayerNorm(self.cfg.d_model, eps=LN_EPSILON) if wanted else nn.Identity()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.src_embed.weight, std=self.cfg.d_model**-0.5)  # keeps sqrt(d)-scaled embeddings ~unit

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        # src_ids, src_mask: (B, S); returns the encoder output (B, S, D)
        b, s = src_ids.shape
        positions = torch.arange(s, device=src_ids.device).expand(b, s)  # (B, S)
        x = self.dropout(self.src_embed_norm(self.positions(self.src_embed(src_ids), positions)))  # (B, S, D)
        bias = padding_bias(src_mask)  # (B, 1, 1, S)
        if self.enc_relative is not None:
            bias = bias + self.enc_relative(positions, positions)  # (B, H, S, S)
        for layer in self.encoder:
            x = layer(x, bias)
        return self.enc_norm(x)

    def cross_kv(self, memory: torch.Tensor) -> list[KV]:
        """Every decoder layer's cross-attention K/V, computed once per source: (B, H, S, Dh) x2 per layer."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder]

    def decode(
        self,
        tgt_ids: torch.Tensor,
        positions: torch.Tensor,
        self_mask: torch.Tensor,
        src_mask: torch.Tensor,
        cross: list[KV],
        past: list[KV] | None = None,
        causal: bool = True,
    ) -> tuple[torch.Tensor, list[KV]]:
        """New target tokens against the cache.

        tgt_ids, positions: (B, T); self_mask: (B, P+T) 1 = a real key (past slots may be holes);
        src_mask: (B, S); cross: per layer (B, H, S, Dh) x2; past: per layer (B, H, P, Dh) x2 or None.
        causal=False is allowed only when T == 1 (one decoder step sees all its valid keys).
        Returns logits (B, T, V) and the present K/V per layer (B, H, P+T, Dh) x2.
        """
        t = tgt_ids.shape[1]
        x = self.dropout(self.tgt_embed_norm(self.tgt_positions(self.tgt_embed(tgt_ids), positions)))  # (B, T, D)
        self_bias = padding_bias(self_mask)  # (B, 1, 1, P+T)
        if causal:
            self_bias = self_bias + causal_bias(t, self_mask.shape[1], tgt_ids.device)  # (B, 1, T, P+T)
        if self.dec_relative is not None:  # a key's position: how many real keys precede it (past slots may be holes)
            key_positions = torch.cumsum(self_mask.to(torch.int64), dim=1) - 1  # (B, P+T)
            self_bias = self_bias + self.dec_relative(positions, key_positions)  # (B, H, T, P+T)
        cross_bias = padding_bias(src_mask)  # (B, 1, 1, S)
        present: list[KV] = []
        for i, layer in enumerate(self.decoder):
            x, kv = layer(x, self_bias, None if past is None else past[i], cross[i], cross_bias)
            present.append(kv)
        x = self.dec_norm(x)
        if self.cfg.scale_output:  # T5 v1.0's tied output: d_model^-0.5 before the shared embedding
            x = x * (self.cfg.d_model ** -0.5)
        logits = self.out_proj(x)  # (B, T, V)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        return logits, present

    def forward(
        self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_ids: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        """Teacher forcing: (B, S) sources and (B, T) shifted targets -> logits (B, T, V)."""
        b, t = tgt_ids.shape
        cross = self.cross_kv(self.encode(src_ids, src_mask))
        positions = torch.arange(t, device=tgt_ids.device).expand(b, t)  # (B, T)
        logits, _ = self.decode(tgt_ids, positions, tgt_mask, src_mask, cross)
        return logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
