#!/usr/bin/env python3
"""Makes and checks the PyTorch reference data of nn/torch_reference_test.cc.

    python3 tools/torch_ref/reference.py            # writes nn/testdata/torch_ref/
    python3 tools/torch_ref/reference.py --check    # regenerates into a temporary folder
                                                    # and compares with the committed files

It runs itself in the benchmarks' torch virtual environment (bench/cpu/setup.sh torch, plus
`transformers` from PyPI; nothing is downloaded from a model hub), like
tools/hf/gpt2_testdata.py. For our nn::Gpt (transformers' GPT2LMHeadModel) and our nn::Llama
(LlamaForCausalLM, attn_implementation="eager") at three small configurations each, it draws
random weights (seeded), rounds them to float32, builds the transformers model in float64
from those rounded values, runs it on random ids, takes the mean cross-entropy against random
targets and its gradients, and writes one safetensors file per configuration:

  param.<name>   F32  every weight in OUR naming and layout (nn::Gpt / nn::Llama
                      NamedParameters(): GPT-2's Conv1D weights transposed to [out, in])
  grad.<name>    F64  the float64 gradient of the loss for that weight, same layout
  ids, targets   I32  [B, T]
  loss           F64  []
  __metadata__        "model" (gpt or llama), the config fields as our config structs name
                      them, "batch", "seq", and the torch and transformers versions.

The reference is float64 throughout. transformers' Llama computes three things in float32
whatever the model's dtype: RMSNorm's statistics (hidden_states.to(torch.float32)), the rotary
cos/sin tables and the eager attention's softmax (dtype=torch.float32). For the reference
those three are replaced by the same formulas in the input's dtype (patched_llama below); the
script prints how far the stock float64 model's loss is from the patched one. GPT-2 needs no
patch. `make test` needs none of this: the files are committed.

--check regenerates everything into a temporary folder and compares it with the committed
files: weights, ids and targets bit for bit, loss and gradients within 1e-12 of each
tensor's largest magnitude (exit 1 otherwise).
"""

import contextlib
import os
import sys

import common

OUT = os.path.join(common.ROOT, "nn", "testdata", "torch_ref")

# Our GptConfig fields (nn/gpt.h) and the batch; GPT-2 ties lm_head to wte.
GPT_CONFIGS = {
    "gpt_2l_4h": dict(vocab_size=64, block_size=16, n_embd=24, n_layer=2, n_head=4,
                      batch=2, seq=16, seed=1),
    "gpt_1l_2h": dict(vocab_size=50, block_size=12, n_embd=24, n_layer=1, n_head=2,
                      batch=3, seq=10, seed=2),
    "gpt_3l_1h": dict(vocab_size=40, block_size=8, n_embd=16, n_layer=3, n_head=1,
                      batch=2, seq=8, seed=3),
}

# Our LlamaConfig fields (nn/llama.h) and the batch.
LLAMA_CONFIGS = {
    "llama_gqa_untied": dict(vocab_size=64, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                             tie_word_embeddings=False, batch=2, seq=16, seed=4),
    "llama_mha_tied": dict(vocab_size=48, hidden_size=24, intermediate_size=40,
                           num_hidden_layers=1, num_attention_heads=3, num_key_value_heads=3,
                           max_position_embeddings=16, rms_norm_eps=1e-5, rope_theta=500000.0,
                           tie_word_embeddings=True, batch=3, seq=12, seed=5),
    "llama_mqa_3l": dict(vocab_size=40, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                         max_position_embeddings=8, rms_norm_eps=1e-6, rope_theta=10000.0,
                         tie_word_embeddings=False, batch=2, seq=8, seed=6),
}


def role(name, shape):
    """Each weight's role in common.random_weights: biases, norm weights, the token and
    position embeddings (0.5 both), matrices."""
    if name.endswith("bias"):
        return "bias"
    if "ln_" in name or "norm" in name:
        return "norm"
    if name in ("wte.weight", "wpe.weight", "embed_tokens.weight"):
        return "embedding"
    return "matrix"


# ---- GPT-2 (NOTE [GPT-2 layout] in checkpoint/hf_gpt2.h).

GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
GPT2_OURS = {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj", "mlp.c_fc": "mlp.fc",
             "mlp.c_proj": "mlp.proj"}


def gpt_our_name(hf):
    """Our name of a GPT2LMHeadModel parameter and whether its layout is transposed."""
    name = hf.removeprefix("transformer.")
    if name.startswith("h."):
        _, layer, rest = name.split(".", 2)
        for conv in GPT2_CONV1D:
            if rest.startswith(conv + "."):
                suffix = rest[len(conv) + 1:]
                return f"blocks.{layer}.{GPT2_OURS[conv]}.{suffix}", suffix == "weight"
        return f"blocks.{layer}.{rest}", False
    return name, False


def gpt_model(c):
    import torch
    import transformers

    config = transformers.GPT2Config(
        vocab_size=c["vocab_size"], n_positions=c["block_size"], n_embd=c["n_embd"],
        n_layer=c["n_layer"], n_head=c["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    model = model.to(torch.float64).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    return model, gpt_our_name


# ---- Llama.

def llama_model(c):
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=c["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
        tie_word_embeddings=c["tie_word_embeddings"], attention_bias=False, mlp_bias=False,
        hidden_act="silu", attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
        pad_token_id=None)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    model = model.to(torch.float64).eval()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == c["tie_word_embeddings"]
    return model, lambda hf: (hf.removeprefix("model."), False)


@contextlib.contextmanager
def patched_llama(calls):
    """transformers' Llama with RMSNorm's statistics, the rotary tables and the eager
    softmax computed in the input's dtype instead of float32 (same formulas otherwise).
    `calls` counts the patched attention's calls, to show it ran."""
    import torch
    from transformers.models.llama import modeling_llama as ml

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        dim = self.config.hidden_size // self.config.num_attention_heads
        theta = self.config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    stock_attention = ml.eager_attention_forward

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        calls.append(1)
        key_states = ml.repeat_kv(key, module.num_key_value_groups)
        value_states = ml.repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
        return attn_output, attn_weights

    saved = (ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward)
    ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward = rms_norm, rotary
    ml.eager_attention_forward = attention
    try:
        yield
    finally:
        ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward = saved
        ml.eager_attention_forward = stock_attention


# ---- One configuration.

def loss_and_grads(model, ids, targets):
    import torch

    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids.long()).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1).long())
    loss.backward()
    return loss


def reference(kind, c):
    """The tensors and metadata of one configuration's file; prints its figures."""
    import torch
    import transformers

    model, our_name = (gpt_model if kind == "gpt" else llama_model)(c)
    hf_params = dict(model.named_parameters())  # a tied weight once, under its first name
    shapes = {}
    for hf, p in hf_params.items():
        ours, transposed = our_name(hf)
        shapes[ours] = tuple(p.shape[::-1]) if transposed else tuple(p.shape)
    weights = common.random_weights(shapes, c["seed"], role)
    with torch.no_grad():
        for hf, p in hf_params.items():
            ours, transposed = our_name(hf)
            w = weights[ours].to(torch.float64)
            p.copy_(w.t() if transposed else w)
    gen = torch.Generator().manual_seed(1000 + c["seed"])
    ids = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=gen,
                        dtype=torch.int32)
    targets = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=gen,
                            dtype=torch.int32)
    if kind == "llama":
        stock = loss_and_grads(model, ids, targets).item()
        calls = []
        with patched_llama(calls):
            loss = loss_and_grads(model, ids, targets)
        assert len(calls) == c["num_hidden_layers"], "the patched attention did not run"
        note = f", stock transformers (fp32 norm/rope/softmax) off by {abs(stock - loss.item()) / loss.item():.2e} relative"
    else:
        loss = loss_and_grads(model, ids, targets)
        note = ""
    grads = {}
    for hf, p in hf_params.items():
        ours, transposed = our_name(hf)
        grads[ours] = p.grad.t() if transposed else p.grad
    tensors = {"ids": ids.contiguous(), "targets": targets.contiguous(),
               "loss": loss.detach().to(torch.float64).reshape(()).contiguous()}
    tensors.update(common.weights_and_gradients(weights, grads))
    metadata = common.metadata(c, kind, transformers=transformers.__version__)
    print(f"  {kind} {metadata}: loss {loss.item():.17g}{note}")
    return tensors, metadata


def references():
    for kind, configs in (("gpt", GPT_CONFIGS), ("llama", LLAMA_CONFIGS)):
        for name, c in configs.items():
            yield (name + ".safetensors", *reference(kind, c))


if __name__ == "__main__":
    sys.exit(common.main(__file__, __doc__, OUT, references, "torch_ref_"))
