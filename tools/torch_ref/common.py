"""What the PyTorch reference scripts of tools/torch_ref share: their random weights, their
command line, writing their safetensors files and checking fresh ones against the committed.

A script gives its parameter shapes and which role each parameter plays, builds each file's
tensors and metadata, and hands a generator of them to main:

    import common

    def references():  # one (file name, tensors, metadata) per file, printing its figures
        weights = common.random_weights(shapes, seed, role)
        ...
        yield "x_ref.safetensors", tensors, common.metadata(c, "x")

    if __name__ == "__main__":
        sys.exit(common.main(__file__, __doc__, OUT, references, "x_ref_"))

Each file holds, besides what the script adds, param.<name> (F32, the weights drawn here) and
grad.<name> (F64, the float64 gradient of the loss), from weights_and_gradients.

The command line: no flag writes the files into --out (the script's folder by default); --check
writes them into a temporary folder and compares them with those in --out (compare says how).
Either way the script first runs itself again in the torch environment (tools/torch_venv.py).
"""

import argparse
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import torch_venv  # noqa: E402

# A parameter's role -> its value from a standard normal float32 draw, with standard
# deviations that keep activations O(1) and every term visible.
ROLES = {
    "matrix": lambda draw, shape: draw / math.sqrt(shape[1]),  # 1/sqrt(in)
    "embedding": lambda draw, shape: 0.5 * draw,
    "positions": lambda draw, shape: 0.3 * draw,
    "bias": lambda draw, shape: 0.1 * draw,
    "norm": lambda draw, shape: 1.0 + 0.1 * draw,  # a norm's weight
}


def random_weights(shapes, seed, role):
    """{name: float32 tensor} for `shapes` ({name: shape}, drawn in that order from one
    generator seeded with `seed`), each scaled as ROLES says for role(name, shape). float32,
    so the float64 reference starts from exactly these values."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        draw = torch.randn(shape, generator=gen, dtype=torch.float32)
        out[name] = ROLES[role(name, shape)](draw, shape)
    return out


def weights_and_gradients(weights, grads):
    """The file's param.<name> (the float32 weights) and grad.<name> (`grads`, in float64)
    tensors, in the order of `weights`."""
    import torch

    out = {}
    for name, w in weights.items():
        out["param." + name] = w.contiguous()
        out["grad." + name] = grads[name].to(torch.float64).contiguous()
    return out


def metadata(c, model, **versions):
    """A file's metadata: the configuration `c` but its seed, as text, then the model's kind,
    the torch version and `versions` (e.g. transformers=...)."""
    import torch

    out = {k: str(v) for k, v in c.items() if k != "seed"}
    out.update(model=model, torch=torch.__version__, **versions)
    return out


def make(out, references):
    """Writes each file of `references()` into the folder `out` (deterministic algorithms on)."""
    import torch
    from safetensors.torch import save_file

    torch.use_deterministic_algorithms(True)
    os.makedirs(out, exist_ok=True)
    for name, tensors, meta in references():
        path = os.path.join(out, name)
        save_file(tensors, path, metadata=meta)
        os.chmod(path, 0o644)  # the writer makes it private; it is committed
        print(f"wrote {path} ({os.path.getsize(path) // 1024} KiB)")


def check(out, references, prefix):
    """Regenerates into a temporary folder (named from `prefix`) and compares with the files
    in `out`."""
    with tempfile.TemporaryDirectory(prefix=prefix) as fresh:
        make(fresh, references)
        return compare(out, fresh)


def compare(out, fresh):
    """Whether every file in `fresh` holds what its namesake in `out` holds: the same tensor
    names, dtypes and shapes, the tensors other than float64 bit for bit, the float64 ones within
    1e-12 of each tensor's largest magnitude. Prints each file's figures and the verdict."""
    from safetensors.torch import load_file

    ok = True
    for name in sorted(os.listdir(fresh)):
        if not os.path.exists(os.path.join(out, name)):
            print(f"{name}: not in {out}")
            ok = False
            continue
        want, got = load_file(os.path.join(out, name)), load_file(os.path.join(fresh, name))
        if set(want) != set(got):
            print(f"{name}: tensors differ: {sorted(set(want) ^ set(got))}")
            ok = False
            continue
        worst, worst_name = 0.0, ""
        for key in want:
            a, b = want[key], got[key]
            if a.dtype != b.dtype or a.shape != b.shape:
                print(f"{name}: {key} is {b.dtype} {list(b.shape)}, committed {a.dtype} {list(a.shape)}")
                ok = False
            elif str(a.dtype) != "torch.float64":
                if not bool((a == b).all()):
                    print(f"{name}: {key} differs from the committed bits")
                    ok = False
            else:
                scale = max(float(a.abs().max()), 1e-300)
                ratio = float((a - b).abs().max()) / scale
                if ratio > worst:
                    worst, worst_name = ratio, key
        print(f"{name}: float64 tensors within {worst:.3g} of their largest magnitude"
              + (f" (worst {worst_name})" if worst_name else ""))
        ok = ok and worst <= 1e-12
    print(f"a fresh run against {out}: {'OK' if ok else 'DIFFERENT'}")
    return ok


def main(script, doc, out, references, prefix):
    """The command line of `script` (its docstring `doc`, its default folder `out`): writes
    or checks (in a temporary folder named from `prefix`) the files of `references`, in the
    torch environment. Returns the exit code."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=out)
    p.add_argument("--check", action="store_true")
    p.add_argument("--in_venv", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.in_venv:
        return torch_venv.rerun_in_venv(script)
    if args.check:
        return 0 if check(args.out, references, prefix) else 1
    make(args.out, references)
    return 0
