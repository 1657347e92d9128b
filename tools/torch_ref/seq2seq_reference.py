#!/usr/bin/env python3
"""Makes and checks the PyTorch reference data of examples/seq2seq/seq2seq_torch_test.cc.

    python3 tools/torch_ref/seq2seq_reference.py            # writes examples/seq2seq/testdata/
    python3 tools/torch_ref/seq2seq_reference.py --check    # regenerates into a temporary
                                                            # folder and compares

It runs itself in the benchmarks' torch virtual environment (tools/torch_venv.py), like
tools/torch_ref/reference.py (torch_venv adds transformers there if missing; this script
needs only torch and safetensors). transformers has no model of ours, so the model is written
here in plain PyTorch, op for op as examples/seq2seq/seq2seq.cc (the C++ model is the spec):

  x = embed[src] + encoder_positions[:S]
  encoder layer: x += Attn(LN1(x), LN1(x), mask); x += Mlp(LN2(x))
  memory = encoder_norm(x)
  y = embed[tgt] + decoder_positions[:T]
  decoder layer: y += CausalAttn(LN1(y), LN1(y)); y += Attn(LN2(y), memory, mask);
                 y += Mlp(LN3(y))
  logits = decoder_norm(y) embed^T
  loss = mean cross-entropy over labels != -100

LN(x) = (x - mean) / sqrt(var + eps) w + b (var biased, eps the float32 1e-5 our config holds).
Attn(x, m, mask): q = x Wq^T + bq, k = m Wk^T (no key bias), v = m Wv^T + bv, split
[B, T, H, D] -> [B, H, T, D], softmax(q k^T / sqrt(D)) with the source padding (mask 0) and,
when causal, keys after the query left out, heads joined back to [B, T, C], then Wo, bo.
Mlp(x) = W2 GELU_tanh(W1 x + b1) + b2. Dropout is 0.

At one small configuration it draws random weights (seeded, float32, then used in float64),
a padded batch of the reverse task's layout (examples/seq2seq/reverse_task.h: pad 0, bos 1,
eos 2, symbols from 3; one row of length 1 and one of full length among random ones), and
writes one safetensors file:

  param.<name>   F32  every weight in OUR naming (seq2seq::Seq2Seq's NamedParameters())
  grad.<name>    F64  the float64 gradient of the loss for that weight
  src            I32  [B, S]          src_mask  I32  [B, 1, 1, S] (1 real, 0 padding)
  tgt            I32  [B, S + 1]      labels    I32  [B, S + 1] (-100 over the padding)
  loss           F64  []
  __metadata__        "model" (seq2seq), the config fields as Seq2SeqConfig names them,
                      "batch", "max_symbols" and the torch version.

--check regenerates into a temporary folder and compares with the committed file: weights
and ids bit for bit, loss and gradients within 1e-12 of each tensor's largest magnitude
(exit 1 otherwise).
"""

import math
import os
import sys

import common

OUT = os.path.join(common.ROOT, "examples", "seq2seq", "testdata")
NAME = "seq2seq_ref.safetensors"

# Our Seq2SeqConfig fields (examples/seq2seq/seq2seq.h) and the batch.
CONFIG = dict(vocab=16, width=12, heads=4, hidden=24, encoder_layers=2, decoder_layers=2,
              max_positions=8, layer_norm_eps=1e-5, batch=6, max_symbols=7, seed=7)

PAD, BOS, EOS, FIRST_SYMBOL, IGNORE = 0, 1, 2, 3, -100


def shapes(c):
    """Our parameter names and shapes, as seq2seq.cc registers them."""
    w, h = c["width"], c["hidden"]
    out = {"embed": (c["vocab"], w), "encoder_positions": (c["max_positions"], w),
           "decoder_positions": (c["max_positions"], w)}

    def norm(prefix):
        out[prefix + ".weight"] = (w,)
        out[prefix + ".bias"] = (w,)

    def attention(prefix):
        for m in ("wq", "wk", "wv", "wo"):
            out[f"{prefix}.{m}"] = (w, w)
        for b in ("bq", "bv", "bo"):
            out[f"{prefix}.{b}"] = (w,)

    def mlp(prefix):
        out.update({prefix + ".w1": (h, w), prefix + ".b1": (h,), prefix + ".w2": (w, h),
                    prefix + ".b2": (w,)})

    for i in range(c["encoder_layers"]):
        norm(f"encoder{i}.norm1")
        norm(f"encoder{i}.norm2")
        attention(f"encoder{i}.attention")
        mlp(f"encoder{i}.mlp")
    for i in range(c["decoder_layers"]):
        for n in ("norm1", "norm2", "norm3"):
            norm(f"decoder{i}.{n}")
        attention(f"decoder{i}.self_attention")
        attention(f"decoder{i}.cross_attention")
        mlp(f"decoder{i}.mlp")
    norm("encoder_norm")
    norm("decoder_norm")
    return out


def role(name, shape):
    """Each weight's role in common.random_weights: the embedding, the positions, norm
    weights, biases (norm biases included), matrices."""
    if name == "embed":
        return "embedding"
    if name.endswith("positions"):
        return "positions"
    if name.rsplit(".", 1)[-1] == "weight":  # a norm's
        return "norm"
    if len(shape) == 1:
        return "bias"
    return "matrix"


def reverse_batch(c):
    """Rows of the reverse task's layout (reverse_task.h) with lengths of our own: the
    first row has one symbol, the second max_symbols, the rest random."""
    import torch

    gen = torch.Generator().manual_seed(1000 + c["seed"])
    rows, s = c["batch"], c["max_symbols"]
    src = torch.full((rows, s), PAD, dtype=torch.int32)
    mask = torch.zeros((rows, 1, 1, s), dtype=torch.int32)
    tgt = torch.full((rows, s + 1), PAD, dtype=torch.int32)
    labels = torch.full((rows, s + 1), IGNORE, dtype=torch.int32)
    lengths = [1, s] + torch.randint(1, s + 1, (rows - 2,), generator=gen).tolist()
    for i, n in enumerate(lengths):
        symbols = torch.randint(FIRST_SYMBOL, c["vocab"], (n,), generator=gen, dtype=torch.int32)
        src[i, :n] = symbols
        mask[i, 0, 0, :n] = 1
        tgt[i, 0] = BOS
        tgt[i, 1:n + 1] = symbols.flip(0)
        labels[i, :n] = symbols.flip(0)
        labels[i, n] = EOS
    return src, mask, tgt, labels


# ---- The model, in float64 (the docstring above says what each step is).

def layer_norm(x, p, prefix, eps):
    import torch

    return torch.nn.functional.layer_norm(x, x.shape[-1:], p[prefix + ".weight"],
                                          p[prefix + ".bias"], eps)


def attention(x, memory, p, prefix, heads, mask=None, causal=False):
    import torch

    def split(t):  # [B, L, C] -> [B, H, L, D]
        b, n, w = t.shape
        return t.reshape(b, n, heads, w // heads).permute(0, 2, 1, 3)

    q = split(x @ p[prefix + ".wq"].t() + p[prefix + ".bq"])
    k = split(memory @ p[prefix + ".wk"].t())
    v = split(memory @ p[prefix + ".wv"].t() + p[prefix + ".bv"])
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, T, S]
    drop = torch.zeros(scores.shape, dtype=torch.bool)
    if mask is not None:
        drop = drop | (mask == 0)
    if causal:
        t, s = scores.shape[-2:]
        drop = drop | torch.ones(t, s, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(drop, float("-inf")), dim=-1)
    y = (weights @ v).permute(0, 2, 1, 3)  # [B, T, H, D]
    y = y.reshape(y.shape[0], y.shape[1], -1)
    return y @ p[prefix + ".wo"].t() + p[prefix + ".bo"]


def mlp(x, p, prefix):
    import torch

    h = torch.nn.functional.gelu(x @ p[prefix + ".w1"].t() + p[prefix + ".b1"],
                                 approximate="tanh")
    return h @ p[prefix + ".w2"].t() + p[prefix + ".b2"]


def seq2seq_logits(p, c, src, mask, tgt, eps):
    heads = c["heads"]
    s, t = src.shape[1], tgt.shape[1]
    x = p["embed"][src.long()] + p["encoder_positions"][:s]
    for i in range(c["encoder_layers"]):
        e = f"encoder{i}"
        n = layer_norm(x, p, e + ".norm1", eps)
        x = x + attention(n, n, p, e + ".attention", heads, mask=mask)
        x = x + mlp(layer_norm(x, p, e + ".norm2", eps), p, e + ".mlp")
    memory = layer_norm(x, p, "encoder_norm", eps)
    y = p["embed"][tgt.long()] + p["decoder_positions"][:t]
    for i in range(c["decoder_layers"]):
        d = f"decoder{i}"
        n = layer_norm(y, p, d + ".norm1", eps)
        y = y + attention(n, n, p, d + ".self_attention", heads, causal=True)
        y = y + attention(layer_norm(y, p, d + ".norm2", eps), memory, p,
                          d + ".cross_attention", heads, mask=mask)
        y = y + mlp(layer_norm(y, p, d + ".norm3", eps), p, d + ".mlp")
    return layer_norm(y, p, "decoder_norm", eps) @ p["embed"].t()


def reference(c):
    """The tensors and metadata of the file; prints its figures."""
    import torch

    weights = common.random_weights(shapes(c), c["seed"], role)
    params = {k: w.to(torch.float64).requires_grad_() for k, w in weights.items()}
    src, mask, tgt, labels = reverse_batch(c)
    # Our config holds eps as a float: the float64 model takes that float's exact value.
    eps = float(torch.tensor(c["layer_norm_eps"], dtype=torch.float32))
    logits = seq2seq_logits(params, c, src, mask, tgt, eps)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]),
                                             labels.reshape(-1).long(), ignore_index=IGNORE)
    loss.backward()
    tensors = {"src": src, "src_mask": mask, "tgt": tgt, "labels": labels,
               "loss": loss.detach().reshape(()).contiguous()}
    tensors.update(common.weights_and_gradients(weights, {k: p.grad for k, p in params.items()}))
    metadata = common.metadata(c, "seq2seq")
    tokens = int((labels != IGNORE).sum())
    print(f"  seq2seq {metadata}: {tokens} target tokens, lengths "
          f"{mask.sum((1, 2, 3)).tolist()}, loss {loss.item():.17g}")
    return tensors, metadata


def references():
    yield (NAME, *reference(CONFIG))


if __name__ == "__main__":
    sys.exit(common.main(__file__, __doc__, OUT, references, "seq2seq_ref_"))
