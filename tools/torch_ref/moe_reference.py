#!/usr/bin/env python3
"""Makes and checks the PyTorch reference data of examples/moe/moe_torch_test.cc.

    python3 tools/torch_ref/moe_reference.py            # writes examples/moe/testdata/
    python3 tools/torch_ref/moe_reference.py --check    # regenerates into a temporary
                                                        # folder and compares

It runs itself in the benchmarks' torch virtual environment (tools/torch_venv.py), like
tools/torch_ref/seq2seq_reference.py (this script needs only torch and safetensors).
transformers has no model of ours, so the model is written here in plain PyTorch, op for op
as examples/moe/moe.cc (the C++ model is the spec; moe.h says what each step is):

  h = embed[ids] + positions[:T]
  block: h = x + Attn(LN1(x)); m, aux_i = Moe(LN2(h)); y = h + m
  logits = LN(h) embed^T
  loss = mean cross-entropy(logits, targets) + aux_weight * sum_i aux_i

LN(x) = (x - mean) / sqrt(var + eps) w + b (var biased, eps the float32 1e-5 of nn::LayerNorm).
Attn is nn::CausalSelfAttention (nanoGPT's): qkv = x Wqkv^T + bqkv [B, T, 3C] read as
q, k, v = its columns [0, C), [C, 2C), [2C, 3C), each split into heads of C / heads
consecutive columns, softmax(q k^T / sqrt(D)) with keys after the query left out, heads
joined back to [B, T, C], then Wproj, bproj.
Moe, on the tokens x [N = B T, C]: p = softmax(x Wr^T) over E experts; e1 the first
maximum, e2 the first maximum of the others; w_i = p[e_i] / (p[e1] + p[e2]);
out = w_1 Expert_e1(x) + w_2 Expert_e2(x), each expert run on the tokens routed to it,
Expert(x) = W2 GELU_tanh(W1 x + b1) + b2. The gradient reaches the router through w_1 and w_2
(and the balance loss), not through the discrete choice. aux = mean over sequences b of
E sum_e f_be P_be, f_be = the count of b's top-2 choices of e / 2T (a constant), P_be = the
mean of p[e] over b's tokens (NOTE [Sequence-level balance loss] in moe.h).

At one small configuration it draws random weights (seeded, float32, then used in float64;
norm weights and biases drawn too) and random ids and targets, checks that every expert of
every block gets tokens (else its parameters would have no gradient) and that no routing
choice is within ROUTING_GAP of a tie (between the 1st and 2nd or the 2nd and 3rd
probability of any token, so our float32 model chooses as this float64 one does), and writes
one safetensors file:

  param.<name>   F32  every weight in OUR naming (moe::MoeDecoder's NamedParameters())
  grad.<name>    F64  the float64 gradient of the loss for that weight
  ids, targets   I32  [B, T]
  loss           F64  []      the total above
  aux            F64  []      the sum over blocks of the balance loss
  __metadata__        "model" (moe), the config fields as MoeConfig names them (aux_weight
                      included), "batch", "seq" and the torch version.

--check regenerates into a temporary folder and compares with the committed file: weights
and ids bit for bit, loss, aux and gradients within 1e-12 of each tensor's largest magnitude
(exit 1 otherwise).
"""

import math
import os
import sys

import common

OUT = os.path.join(common.ROOT, "examples", "moe", "testdata")
NAME = "moe_ref.safetensors"

# Our MoeConfig fields (examples/moe/moe.h) and the batch. aux_weight is 10 times the
# default so the balance loss's share of each router gradient is well above the tolerance.
CONFIG = dict(vocab=16, width=12, heads=3, expert_hidden=16, experts=4, blocks=2,
              max_positions=8, aux_weight=0.1, batch=4, seq=8, seed=11)

LAYER_NORM_EPS = 1e-5  # nn::LayerNorm's default, a float
ROUTING_GAP = 1e-4


def shapes(c):
    """Our parameter names and shapes, as moe.cc and nn/ register them."""
    w, h = c["width"], c["expert_hidden"]
    out = {"embed": (c["vocab"], w), "positions": (c["max_positions"], w)}

    def norm(prefix):
        out[prefix + ".weight"] = (w,)
        out[prefix + ".bias"] = (w,)

    for i in range(c["blocks"]):
        b = f"block{i}"
        norm(b + ".norm1")
        out.update({b + ".attention.qkv.weight": (3 * w, w), b + ".attention.qkv.bias": (3 * w,),
                    b + ".attention.proj.weight": (w, w), b + ".attention.proj.bias": (w,)})
        norm(b + ".norm2")
        out[b + ".moe.router"] = (c["experts"], w)
        for e in range(c["experts"]):
            x = f"{b}.moe.expert{e}"
            out.update({x + ".w1": (h, w), x + ".b1": (h,), x + ".w2": (w, h), x + ".b2": (w,)})
    norm("norm")
    return out


def role(name, shape):
    """Each weight's role in common.random_weights: the embedding, the positions, norm
    weights, biases (norm biases included), matrices."""
    module = name.rsplit(".", 2)[-2] if "." in name else ""
    if name == "embed":
        return "embedding"
    if name == "positions":
        return "positions"
    if module.startswith("norm") and name.endswith(".weight"):
        return "norm"
    if len(shape) == 1:
        return "bias"
    return "matrix"


def batch(c):
    import torch

    gen = torch.Generator().manual_seed(1000 + c["seed"])
    shape = (c["batch"], c["seq"])
    ids = torch.randint(0, c["vocab"], shape, generator=gen, dtype=torch.int32)
    targets = torch.randint(0, c["vocab"], shape, generator=gen, dtype=torch.int32)
    return ids, targets


# ---- The model, in float64 (the docstring above says what each step is).

def layer_norm(x, p, prefix, eps):
    import torch

    return torch.nn.functional.layer_norm(x, x.shape[-1:], p[prefix + ".weight"],
                                          p[prefix + ".bias"], eps)


def causal_attention(x, p, prefix, heads):
    import torch

    b, t, w = x.shape
    qkv = x @ p[prefix + ".qkv.weight"].t() + p[prefix + ".qkv.bias"]

    def split(m):  # [B, T, C] -> [B, H, T, D]
        return m.reshape(b, t, heads, w // heads).permute(0, 2, 1, 3)

    q, k, v = (split(m) for m in qkv.split(w, dim=-1))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(w // heads)  # [B, H, T, T]
    later = torch.ones(t, t, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1)
    y = (weights @ v).permute(0, 2, 1, 3).reshape(b, t, w)
    return y @ p[prefix + ".proj.weight"].t() + p[prefix + ".proj.bias"]


def expert(x, p, prefix):
    import torch

    h = torch.nn.functional.gelu(x @ p[prefix + ".w1"].t() + p[prefix + ".b1"],
                                 approximate="tanh")
    return h @ p[prefix + ".w2"].t() + p[prefix + ".b2"]


def moe_layer(x, p, prefix, experts, routing):
    """{x [B, T, C]} -> (y [B, T, C], aux []); appends this layer's routing (the
    probabilities and the two choices, detached) to `routing`."""
    import torch

    b, t, w = x.shape
    n = b * t
    tokens = x.reshape(n, w)
    probs = torch.softmax(tokens @ p[prefix + ".router"].t(), dim=-1)  # [N, E]
    e1 = probs.argmax(dim=-1)
    e2 = probs.masked_fill(torch.nn.functional.one_hot(e1, experts).bool(), -1.0).argmax(dim=-1)
    p1 = probs.gather(1, e1[:, None])
    p2 = probs.gather(1, e2[:, None])
    w1, w2 = p1 / (p1 + p2), p2 / (p1 + p2)  # [N, 1]
    out = torch.zeros(n, w, dtype=x.dtype)
    for k in range(experts):
        rows = ((e1 == k) | (e2 == k)).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        gate = torch.where((e1[rows] == k)[:, None], w1[rows], w2[rows])
        out = out.index_add(0, rows, gate * expert(tokens[rows], p, f"{prefix}.expert{k}"))
    chosen = (torch.nn.functional.one_hot(e1, experts)
              + torch.nn.functional.one_hot(e2, experts)).to(x.dtype)  # no gradient
    f = chosen.reshape(b, t, experts).sum(1) / (2 * t)  # [B, E]
    mean_probs = probs.reshape(b, t, experts).mean(1)  # [B, E]
    aux = experts * (f * mean_probs).sum(1).mean()
    routing.append((probs.detach(), e1, e2))
    return out.reshape(b, t, w), aux


def moe_forward(p, c, ids, eps, routing):
    """(logits [B, T, vocab], the blocks' summed aux)."""
    t = ids.shape[1]
    h = p["embed"][ids.long()] + p["positions"][:t]
    aux = 0.0
    for i in range(c["blocks"]):
        b = f"block{i}"
        h = h + causal_attention(layer_norm(h, p, b + ".norm1", eps), p, b + ".attention",
                                 c["heads"])
        m, a = moe_layer(layer_norm(h, p, b + ".norm2", eps), p, b + ".moe", c["experts"],
                         routing)
        h = h + m
        aux = aux + a
    return layer_norm(h, p, "norm", eps) @ p["embed"].t(), aux


def check_routing(routing, experts):
    """Every expert of every block gets tokens, and no choice is within ROUTING_GAP of a
    tie; returns the smallest gap."""
    smallest = 1.0
    for i, (probs, e1, e2) in enumerate(routing):
        used = set(e1.tolist()) | set(e2.tolist())
        if used != set(range(experts)):
            raise RuntimeError(f"block{i}: experts {sorted(set(range(experts)) - used)} get no "
                               "tokens; change CONFIG's seed or batch")
        top = probs.sort(dim=-1, descending=True).values
        gap = min(float((top[:, 0] - top[:, 1]).min()), float((top[:, 1] - top[:, 2]).min()))
        if gap <= ROUTING_GAP:
            raise RuntimeError(f"block{i}: a routing choice within {gap:.2e} of a tie; "
                               "change CONFIG's seed or batch")
        smallest = min(smallest, gap)
    return smallest


def reference(c):
    """The tensors and metadata of the file; prints its figures."""
    import torch

    weights = common.random_weights(shapes(c), c["seed"], role)
    params = {k: w.to(torch.float64).requires_grad_() for k, w in weights.items()}
    ids, targets = batch(c)
    # Our eps and aux_weight are floats at the point of use: the float64 model takes those
    # floats' exact values.
    eps = float(torch.tensor(LAYER_NORM_EPS, dtype=torch.float32))
    aux_weight = float(torch.tensor(c["aux_weight"], dtype=torch.float32))
    routing = []
    logits, aux = moe_forward(params, c, ids, eps, routing)
    gap = check_routing(routing, c["experts"])
    cross_entropy = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]),
                                                      targets.reshape(-1).long())
    loss = cross_entropy + aux_weight * aux
    loss.backward()
    tensors = {"ids": ids.contiguous(), "targets": targets.contiguous(),
               "loss": loss.detach().reshape(()).contiguous(),
               "aux": aux.detach().reshape(()).contiguous()}
    tensors.update(common.weights_and_gradients(weights, {k: p.grad for k, p in params.items()}))
    metadata = common.metadata(c, "moe")
    counts = [torch.bincount(torch.cat([e1, e2]), minlength=c["experts"]).tolist()
              for _, e1, e2 in routing]
    print(f"  moe {metadata}: tokens per expert {counts}, smallest routing gap {gap:.2e}, "
          f"cross-entropy {cross_entropy.item():.17g}, aux {aux.item():.17g}, "
          f"loss {loss.item():.17g}")
    return tensors, metadata


def references():
    yield (NAME, *reference(CONFIG))


if __name__ == "__main__":
    sys.exit(common.main(__file__, __doc__, OUT, references, "moe_ref_"))
