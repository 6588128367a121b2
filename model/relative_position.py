"""T5's relative position bias: a learned (bucket, head) table whose row for the bucket of (key position - query
position) is added to the attention scores; one table per stack, shared by its layers. Bidirectional in the encoder,
unidirectional (keys at or before the query) in the decoder's self-attention."""
from __future__ import annotations

import math

import torch
from torch import nn


def relative_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """The bucket of each relative position (key - query), as Mesh TensorFlow and transformers' T5 compute it: half
    the buckets exact for small distances, the rest logarithmic up to max_distance (int64, same shape)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (torch.log(relative.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


class RelativePositionBias(nn.Module):
    """(query positions (B, T), key positions (B, K)) -> additive score bias (B, H, T, K).

    Every relative position within max_positions has its bucket computed once here (a buffer), so the forward pass
    and the exported graphs look buckets up instead of recomputing the logarithm (identical integers)."""

    def __init__(self, n_heads: int, num_buckets: int, max_distance: int, bidirectional: bool,
                 max_positions: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_buckets, n_heads)  # (buckets, H)
        self.span = max_positions - 1
        relative = torch.arange(-self.span, self.span + 1)  # (2P-1,) key - query
        self.register_buffer("buckets", relative_bucket(relative, bidirectional, num_buckets, max_distance),
                             persistent=False)

    def by_distance(self) -> torch.Tensor:
        """(P, H): the bias of a key d = 0..P-1 positions before its query (what the in-place decoder gathers)."""
        return self.embedding(self.buckets[: self.span + 1].flip(0))

    def forward(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        relative = key_pos[:, None, :] - query_pos[:, :, None]  # (B, T, K)
        index = self.buckets[relative.clamp(-self.span, self.span) + self.span]  # (B, T, K)
        return self.embedding(index).permute(0, 3, 1, 2)  # (B, H, T, K)
