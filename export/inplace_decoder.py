"""decoder_inplace.onnx: one decoder step over preallocated self-attention K/V buffers, built from the PyTorch weights
with onnx.helper (not traced), so every node is chosen: com.microsoft contrib ops that onnxruntime runs fused.

Per layer, for a (batch, 1, d_model) step:
    self-attention   MatMul(packed QKV) + Add -> GroupQueryAttention -> MatMul(W^O) -> skip norm
    cross-attention  MatMul(W^Q) -> MultiHeadAttention(Q bias, cross K/V in BNSH, source mask) -> MatMul -> skip norm
    feed-forward     MatMul + Add -> Relu | Gelu | FastGelu | Sigmoid * x (x gate MatMul) -> MatMul -> skip norm
The skip norm takes the output projection's bias and the residual: LN(x + sublayer + b) (post-LN), or the *next*
LayerNorm with the sum as the new residual stream (pre-LN). It is Add + LayerNormalization (CUDA sessions leave on
onnxruntime's fusion of them into SkipLayerNormalization; CPU sessions turn it off, engine/runtime/device.py),
or SkipSimplifiedLayerNormalization for T5's RMS norm.

GroupQueryAttention (kv_num_heads = num_heads) writes row b's new K/V at column past_sequence_lengths[b] of its
past buffer and attends to columns [0, past_sequence_lengths[b]]. When present.* is bound to the same memory as
past_key_values.* (IO binding), onnxruntime sees equal pointers and writes in place; with separate outputs it
copies the past first (same numbers, more memory traffic).

T5 (relative positions): GroupQueryAttention's attention_bias input is each row's own (B, H, 1, total) bias, gathered
once per step from a (distance, head) table by n_b - column, and shared by every layer; scores are unscaled (scale 1).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from seqserve.contract import names
from seqserve.export.onnx_export import OPSET
from seqserve.model.config import LN_EPSILON, MASK_FILL
from seqserve.model.transformer import Transformer

MS_DOMAIN, MS_OPSET = "com.microsoft", 1
CONTRIB_OPS = ("GroupQueryAttention", "MultiHeadAttention")  # in every decoder_inplace
GELU, FAST_GELU = "Gelu", "FastGelu"  # com.microsoft: a gelu (erf) or gelu_tanh model's activation
SKIP_RMS = "SkipSimplifiedLayerNormalization"  # com.microsoft: SkipLayerNormalization's RMS form (T5)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float32).numpy()


class _Builder:
    """Accumulates nodes and initializers; names every value once."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", outputs: list[str] | None = None,
           **attrs) -> list[str]:
        self._count += 1
        outputs = outputs or [f"{op_type.lower()}_{self._count}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=f"{op_type}_{self._count}", domain=domain,
                                           **attrs))
        return outputs

    def linear(self, x: str, layer: torch.nn.Linear, name: str, bias: bool = True) -> str:
        """x @ W^T (+ b): the MatMul keeps a constant B, which dynamic int8 quantisation needs."""
        (y,) = self.op("MatMul", [x, self.const(f"{name}.weight_t", _np(layer.weight).T)])
        if bias and layer.bias is not None:
            (y,) = self.op("Add", [y, self.const(f"{name}.bias", _np(layer.bias))])
        return y

    def skip_norm(self, sublayer: str, residual: str, bias: torch.Tensor | None, norm: torch.nn.Module, name: str,
                  want_sum: bool) -> tuple[str, str | None]:
        """(LN(residual + (sublayer + bias)), the un-normalised sum if wanted): Add nodes and a LayerNormalization,
        or one SkipSimplifiedLayerNormalization for an RMS norm (no beta; a bias-free model has no skip bias).
        onnxruntime's CPU SkipLayerNormalization took 5x the time of Add + LayerNormalization (docs/benchmarks.md),
        so a LayerNorm model's graph leaves the fusion to the provider: on at load for CUDA, off on the CPU."""
        rms = not hasattr(norm, "bias")
        if not rms:
            if bias is not None:
                (sublayer,) = self.op("Add", [sublayer, self.const(f"{name}.skip_bias", _np(bias))])
            (total,) = self.op("Add", [residual, sublayer])
            (normed,) = self.op("LayerNormalization", [total, self.const(f"{name}.gamma", _np(norm.weight)),
                                                       self.const(f"{name}.beta", _np(norm.bias))], axis=-1,
                                epsilon=norm.eps)
            return normed, (total if want_sum else None)
        inputs = [sublayer, residual, self.const(f"{name}.gamma", _np(norm.weight))]
        if bias is not None:
            inputs += ["", self.const(f"{name}.skip_bias", _np(bias))]  # bias is input 4 (beta's place is empty)
        self._count += 1
        normed, total = f"skipln_{self._count}_out", f"skipln_{self._count}_sum"
        self.nodes.append(helper.make_node(SKIP_RMS, inputs, [normed, "", "", total] if want_sum else [normed],
                                           name=f"{SKIP_RMS}_{self._count}", domain=MS_DOMAIN, epsilon=norm.eps))
        return normed, (total if want_sum else None)


def build_inplace_decoder(model: Transformer) -> onnx.ModelProto:
    """The decoder_inplace graph of `model` (float32), inputs/outputs as names.decoder_inplace_inputs/outputs."""
    cfg = model.cfg
    g = _Builder()
    x = _embed(g, model)  # (B, 1, D) the residual stream
    (src_mask,) = g.op("Cast", [names.ENCODER_ATTENTION_MASK], to=TensorProto.INT32)  # (B, S) the op's mask type
    layers = list(model.decoder)
    norms = [m for layer in layers for m in (layer.res_self.norm, layer.res_cross.norm, layer.res_ffn.norm)]
    # Pre-LN: each skip norm applies the norm the next sublayer (or the final dec_norm) starts with.
    fused = norms[1:] + [model.dec_norm] if cfg.norm_first else norms
    h = x
    if cfg.norm_first:
        h = _first_norm(g, x, norms[0])
    position_bias = _position_bias(g, model)  # (B, H, 1, total) or None
    for i, layer in enumerate(layers):
        sub, last = f"decoder.{i}", i == len(layers) - 1
        a = _self_attention(g, layer.self_attn, h, i, sub, position_bias)
        h, x = _residual(g, a, x, layer.self_attn.o_proj, fused[3 * i], f"{sub}.self", cfg.norm_first)
        c = _cross_attention(g, layer.cross_attn, h, src_mask, i, sub)
        h, x = _residual(g, c, x, layer.cross_attn.o_proj, fused[3 * i + 1], f"{sub}.cross", cfg.norm_first)
        f = _activation(g, g.linear(h, layer.ffn.w1, f"{sub}.ffn.w1"), cfg.activation)  # (B, 1, F)
        if layer.ffn.w3 is not None:  # gated FFN: act(h W1) * (h W3)
            (f,) = g.op("Mul", [f, g.linear(h, layer.ffn.w3, f"{sub}.ffn.w3")])
        f = g.linear(f, layer.ffn.w2, f"{sub}.ffn.w2", bias=False)  # its bias goes into the skip norm
        h, x = _residual(g, f, x, layer.ffn.w2, fused[3 * i + 2], f"{sub}.ffn", cfg.norm_first, keep_sum=not last)
    # Squeeze first: onnxruntime aliases it, while a Squeeze that produced the graph output would copy the logits.
    (h,) = g.op("Squeeze", [h, g.const("axis_1", np.array([1], np.int64))])  # (B, D)
    if cfg.scale_output:  # T5 v1.0: d_model^-0.5 before the tied output projection
        (h,) = g.op("Mul", [h, g.const("output_scale", np.array(cfg.d_model ** -0.5, np.float32))])
    out_weight = _np(model.out_proj.weight).T  # (D, V): a copy even when tied, since Gather needs (V, D)
    if model.final_logits_bias is None:
        g.op("MatMul", [h, g.const("out_proj.weight_t", out_weight)], outputs=[names.LOGITS])  # (B, V)
    else:
        (y,) = g.op("MatMul", [h, g.const("out_proj.weight_t", out_weight)])  # (B, V)
        g.op("Add", [y, g.const("final_logits_bias", _np(model.final_logits_bias))], outputs=[names.LOGITS])
    return _model(g, cfg)


def _activation(g: _Builder, x: str, activation: str) -> str:
    """The FFN's activation: Relu, the contrib Gelu (exact erf form, one fused kernel) or x * Sigmoid(x) (SiLU)."""
    if activation == "relu":
        return g.op("Relu", [x])[0]
    if activation in ("gelu", "gelu_tanh"):
        return g.op(GELU if activation == "gelu" else FAST_GELU, [x], domain=MS_DOMAIN)[0]
    (sig,) = g.op("Sigmoid", [x])
    return g.op("Mul", [x, sig])[0]


def _embed(g: _Builder, model: Transformer) -> str:
    """Token embedding (times sqrt(d_model) when scaled) plus the position vector at each row's own position (3.4,
    3.5), then the embedding LayerNorm if the model has one: (B, 1, D).

    The table pre-multiplied by the scale is bitwise what PyTorch computes per lookup."""
    positions = model.tgt_positions
    scaled = _np(model.tgt_embed.weight) * np.float32(positions.scale)  # (V, D)
    (tok,) = g.op("Gather", [g.const("embed.scaled", scaled), names.DECODER_INPUT_IDS])  # (B, 1, D)
    if model.cfg.positions == "relative":  # T5: positions enter as the attention's bias (_position_bias)
        return tok
    table = _np(positions.rows())[:, None, :]  # (P, 1, D): gathered by (B,) lengths it gives (B, 1, D)
    (pos,) = g.op("Gather", [g.const("positions.table", table), names.PAST_SEQ_LENS])  # (B, 1, D)
    (x,) = g.op("Add", [tok, pos])
    if model.cfg.embed_norm:
        norm = model.tgt_embed_norm
        (x,) = g.op("LayerNormalization", [x, g.const("embed_norm.gamma", _np(norm.weight)),
                                           g.const("embed_norm.beta", _np(norm.bias))], axis=-1, epsilon=LN_EPSILON)
    return x


def _first_norm(g: _Builder, x: str, norm) -> str:
    """The first layer's pre-norm (the later ones ride on the skip norms): LayerNormalization, or RMS norm
    x / sqrt(mean(x^2) + eps) * gamma from plain ops."""
    if hasattr(norm, "bias"):
        return g.op("LayerNormalization", [x, g.const("ln0.gamma", _np(norm.weight)), g.const("ln0.beta",
                    _np(norm.bias))], axis=-1, epsilon=norm.eps)[0]
    (sq,) = g.op("Mul", [x, x])
    (mean,) = g.op("ReduceMean", [sq, g.const("ln0.axes", np.array([-1], np.int64))], keepdims=1)  # (B, 1, 1)
    (std,) = g.op("Sqrt", [g.op("Add", [mean, g.const("ln0.eps", np.array(norm.eps, np.float32))])[0]])
    (y,) = g.op("Div", [x, std])
    return g.op("Mul", [y, g.const("ln0.gamma", _np(norm.weight))])[0]  # (B, 1, D)


def _position_bias(g: _Builder, model: Transformer) -> str | None:
    """T5's decoder self-attention bias for each row at its own position n_b, over key columns 0..total-1:
    table[clip(n_b - column, 0, P - 1)], (B, H, 1, total); columns after n_b are GroupQueryAttention's to mask."""
    if model.dec_relative is None:
        return None
    table = _np(model.dec_relative.by_distance())  # (P, H): the bias of a key d positions back
    (total,) = g.op("Cast", [names.TOTAL_SEQ_LEN], to=TensorProto.INT64)
    (cols,) = g.op("Range", [g.const("bias.zero", np.array(0, np.int64)), total,
                             g.const("bias.one", np.array(1, np.int64))])  # (total,)
    (lens,) = g.op("Cast", [names.PAST_SEQ_LENS], to=TensorProto.INT64)
    (lens,) = g.op("Unsqueeze", [lens, g.const("bias.axis1", np.array([1], np.int64))])  # (B, 1)
    (dist,) = g.op("Sub", [lens, cols])  # (B, total)
    (dist,) = g.op("Clip", [dist, g.const("bias.lo", np.array(0, np.int64)),
                            g.const("bias.hi", np.array(len(table) - 1, np.int64))])
    (bias,) = g.op("Gather", [g.const("bias.table", table), dist])  # (B, total, H)
    (bias,) = g.op("Transpose", [bias], perm=[0, 2, 1])  # (B, H, total)
    return g.op("Unsqueeze", [bias, g.const("bias.axis2", np.array([2], np.int64))])[0]  # (B, H, 1, total)


def _scale(attn) -> float:
    return 1.0 / math.sqrt(attn.head_dim) if attn.scale else 1.0  # T5: unscaled scores


def _self_attention(g: _Builder, attn, h: str, i: int, sub: str, position_bias: str | None) -> str:
    """Packed QKV projection, then GroupQueryAttention over layer i's K/V buffers: (B, 1, D), before W^O's bias.

    (A 2-D (B, D) stream, whose MatMul + Add onnxruntime fuses into Gemm, measured no faster and needs 4 more nodes
    per layer: Unsqueeze / Squeeze around both attention ops.)"""
    packed = np.concatenate([_np(p.weight).T for p in (attn.q_proj, attn.k_proj, attn.v_proj)], axis=1)  # (D, 3HDh)
    (qkv,) = g.op("MatMul", [h, g.const(f"{sub}.self.qkv.weight_t", packed)])
    if attn.q_proj.bias is not None:
        bias = np.concatenate([_np(p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj)])
        (qkv,) = g.op("Add", [qkv, g.const(f"{sub}.self.qkv.bias", bias)])  # (B, 1, 3HDh): Q | K | V, heads in order
    inputs = [qkv, "", "", names.past_input(i, "key"), names.past_input(i, "value"), names.PAST_SEQ_LENS,
              names.TOTAL_SEQ_LEN]
    inputs += [] if position_bias is None else ["", "", "", position_bias]  # no rotary cos/sin nor position_ids
    (a, _, _) = g.op("GroupQueryAttention", inputs,
                     domain=MS_DOMAIN, num_heads=attn.n_heads, kv_num_heads=attn.n_heads, scale=_scale(attn),
                     outputs=[f"{sub}.self.out", names.present_output(i, "key"), names.present_output(i, "value")])
    return g.linear(a, attn.o_proj, f"{sub}.self.o", bias=False)


def _cross_attention(g: _Builder, attn, h: str, src_mask: str, i: int, sub: str) -> str:
    """MultiHeadAttention of the step's query over layer i's precomputed cross K/V (BNSH), source padding masked
    with the model's finite fill: (B, 1, D), before W^O's bias."""
    q = g.linear(h, attn.q_proj, f"{sub}.cross.q", bias=False)  # (B, 1, D)
    inner = attn.n_heads * attn.head_dim
    q_bias = np.concatenate([np.zeros(inner, np.float32) if attn.q_proj.bias is None else _np(attn.q_proj.bias),
                             np.zeros(2 * inner, np.float32)])
    (c,) = g.op("MultiHeadAttention", [q, names.cross_input(i, "key"), names.cross_input(i, "value"),
                                       g.const(f"{sub}.cross.qkv_bias", q_bias), src_mask],  # K/V bias: none
                domain=MS_DOMAIN, num_heads=attn.n_heads, mask_filter_value=float(MASK_FILL),
                scale=_scale(attn))  # (B, 1, H * Dh)
    return g.linear(c, attn.o_proj, f"{sub}.cross.o", bias=False)


def _residual(g: _Builder, sublayer: str, x: str, proj: torch.nn.Linear, norm, name: str, norm_first: bool,
              keep_sum: bool = True) -> tuple[str, str]:
    """(next sublayer's input, residual stream) after one residual block: post-LN (5.4) normalises the sum with
    its own norm; pre-LN keeps the sum as the stream and normalises it with the next block's norm."""
    normed, total = g.skip_norm(sublayer, x, proj.bias, norm, name, want_sum=norm_first and keep_sum)
    return (normed, total) if norm_first else (normed, normed)


def _model(g: _Builder, cfg) -> onnx.ModelProto:
    declared = names.signature(cfg.n_decoder_layers)[names.DECODER_INPLACE]
    static = {names.HEADS: cfg.n_heads, names.HEAD_DIM: cfg.head_dim, names.VOCAB: cfg.vocab_size}
    elem = {names.INT32: TensorProto.INT32, names.INT64: TensorProto.INT64, names.FLOAT32: TensorProto.FLOAT}

    def value(name: str):
        dtype, dims = declared[name]
        return helper.make_tensor_value_info(name, elem[dtype], [static.get(d, d) for d in dims])

    n = cfg.n_decoder_layers
    graph = helper.make_graph(g.nodes, "decoder_inplace", [value(v) for v in names.decoder_inplace_inputs(n)],
                              [value(v) for v in names.decoder_inplace_outputs(n)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, MS_OPSET)],
                              producer_name="seqserve.export.inplace_decoder")
    model.ir_version = 10  # onnxruntime 1.31 reads up to 11; 10 matches the dynamo exporter's graphs
    return model


def manifest_fields(model: Transformer) -> dict:
    """What the manifest says of this graph beside its file entry (the runner picks a decoder graph by these)."""
    return {"kv_cache": names.KV_INPLACE, "max_len": model.cfg.max_positions, "kv_dtype": "float32",
            "contrib_ops": contrib_ops(model.cfg)}


def contrib_ops(cfg) -> list[str]:
    """The com.microsoft ops a model's decoder_inplace uses (GroupQueryAttention, MultiHeadAttention, the skip norm,
    its activation's)."""
    norm = [SKIP_RMS] if cfg.norm == "rms" else []
    return list(CONTRIB_OPS) + norm + {"gelu": [GELU], "gelu_tanh": [FAST_GELU]}.get(cfg.activation, [])


@torch.no_grad()
def export_inplace_decoder(model: Transformer, path) -> None:
    onnx.save(build_inplace_decoder(model.eval()), str(path))
