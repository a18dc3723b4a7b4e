"""tests/torch_interop.py — the PyTorch side of tests/torch_interop.sh.

    torch_interop.py idx DIR SIDE         SIDE x SIDE IDX images (4 classes)
    torch_interop.py prepare WORK FAMILY...
    torch_interop.py compare WORK FAMILY...

prepare, per family F, from WORK/F.torch.safetensors (subtrain export):
  F.batch.safetensors    a batch (seeded): "input", "labels", for torch_probe
  F.resaved.safetensors  subtrain_torch.load then save: the round trip's middle
  F.ref.safetensors      PyTorch's numbers on the batch: fp32 and float64 logits
                         (inference and training mode), the loss, float64
                         and fp32 weight gradients and the running
                         statistics after the float64 training forward
  F.tuned.safetensors    the model after one SGD step in PyTorch (save()), and
                         in F.ref its inference logits on the batch
compare reads torch_probe's F.probe.* and F.tuned_probe.* (subtrain's
numbers) and the round trip's files, prints the relative differences,
and exits 1 when one is above its bound or a round trip is not bitwise.
The relative difference of two tensors is max |a - b| / max |b|, b the
reference; of the gradients, ||a - b|| / ||b|| over the whole gradient
(every parameter's, one vector, 2-norm), the worst tensor's max-norm
one printed beside it with PyTorch's own fp32 error on the same batch.
"""

import copy
import os
import struct
import sys

import torch
import torch.nn.functional as F

import subtrain_torch as st

BOUND = 1e-5          # logits (fp32 against fp32) and gradients (against float64)
BATCH = 8
LR = 0.05


def rel(a, b):
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


def write_idx(path, dims, payload):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(bytes(payload))


def idx(directory, side):
    g = torch.Generator().manual_seed(7)
    h = side // 2
    for name, n in (("tr", 96), ("te", 32)):
        labels = torch.randint(0, 4, (n,), generator=g)
        px = torch.randint(0, 64, (n, side, side), generator=g)
        # a class is a brighter quadrant: something to learn in a few steps
        for i, c in enumerate(labels.tolist()):
            r, q = divmod(c, 2)
            px[i, h * r:h * r + h, h * q:h * q + h] += 160
        write_idx(os.path.join(directory, f"{name}-img"), (n, side, side),
                  px.flatten().tolist())
        write_idx(os.path.join(directory, f"{name}-lab"), (n,), labels.tolist())


def batch_of(model, seed):
    c = model.config
    g = torch.Generator().manual_seed(seed)
    if c.model == "gpt":
        x = torch.randint(0, 256, (BATCH, c.context), generator=g).float()
        y = torch.randint(0, c.classes, (BATCH * c.context,), generator=g).float()
    else:
        x = torch.randn(BATCH, c.in_features, generator=g)
        y = torch.randint(0, c.classes, (BATCH,), generator=g).float()
    return x, y


def inputs(model, x):
    c = model.config
    if c.model == "gpt":
        return x.long()
    if c.in_channels:
        return x.reshape(x.shape[0], c.in_channels, c.in_height, c.in_width)
    return x


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.long())


def prepare(work, family, seed):
    path = os.path.join(work, f"{family}.torch.safetensors")
    model = st.load(path)
    st.save(model, os.path.join(work, f"{family}.resaved.safetensors"))
    x, y = batch_of(model, seed)
    st.write_safetensors(os.path.join(work, f"{family}.batch.safetensors"),
                         {"input": x, "labels": y})
    out = {}
    for dtype, tag in ((torch.float32, "f32"), (torch.float64, "f64")):
        m = copy.deepcopy(model).to(dtype).eval()
        with torch.no_grad():
            out[f"eval_logits_{tag}"] = m(inputs(m, x.to(dtype))).reshape(-1, m.config.classes)
        m.train()
        logits = m(inputs(m, x.to(dtype)))
        loss = loss_of(logits, y)
        out[f"train_logits_{tag}"] = logits.detach().reshape(-1, m.config.classes)
        out[f"train_loss_{tag}"] = loss.detach().reshape(1)
        loss.backward()
        if dtype == torch.float32:
            for name, p in m.named_parameters():
                out[f"grad32.{name}"] = p.grad
        if dtype == torch.float64:
            for name, p in m.named_parameters():
                out[f"grad.{name}"] = p.grad
            for name, b in m.named_buffers():
                if name.endswith(("running_mean", "running_var")):
                    out[f"stat.{name}"] = b
    # one step of training in PyTorch, saved for subtrain
    tuned = copy.deepcopy(model).train()
    opt = torch.optim.SGD(tuned.parameters(), lr=LR)
    opt.zero_grad()
    loss_of(tuned(inputs(tuned, x)), y).backward()
    opt.step()
    st.save(tuned, os.path.join(work, f"{family}.tuned.safetensors"))
    tuned.eval()
    with torch.no_grad():
        out["tuned_eval_logits"] = tuned(inputs(tuned, x)).reshape(-1, tuned.config.classes)
    st.write_safetensors(os.path.join(work, f"{family}.ref.safetensors"),
                         {k: v.detach().double() for k, v in out.items()})


def same_tensors(a_path, b_path, what):
    """Bitwise: the same names, dtypes, shapes and bytes."""
    a, _ = st.read_safetensors(a_path)
    b, _ = st.read_safetensors(b_path)
    if list(a) != list(b):
        return f"{what}: tensors {sorted(set(a) ^ set(b)) or 'in another order'}"
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            return f"{what}: '{k}' is {a[k].dtype} {list(a[k].shape)}, {b[k].dtype} " \
                   f"{list(b[k].shape)}"
        if a[k].numpy().tobytes() != b[k].numpy().tobytes():
            return f"{what}: '{k}' differs"
    return None


def compare(work, family):
    """Prints the family's line; returns the failures."""
    p = lambda name: os.path.join(work, f"{family}.{name}.safetensors")  # noqa: E731
    ref, _ = st.read_safetensors(p("ref"))
    probe, _ = st.read_safetensors(p("probe.logits"))
    grads, _ = st.read_safetensors(p("probe.grads"))
    tuned, _ = st.read_safetensors(p("tuned_probe.logits"))
    fails = []
    r = {
        "eval": rel(probe["eval_logits"], ref["eval_logits_f32"]),
        "train": rel(probe["train_logits"], ref["train_logits_f32"]),
        "loss": rel(probe["train_loss"], ref["train_loss_f32"]),
        "eval64": rel(probe["eval_logits"], ref["eval_logits_f64"]),
        "tuned": rel(tuned["eval_logits"], ref["tuned_eval_logits"]),
    }
    # gradients: the whole vector's relative error in the 2-norm (the
    # bound), and per tensor the largest (max |a - b| / max |b|), with
    # PyTorch's own fp32 on the same batch for the scale of fp32 rounding
    names = [k[5:] for k in ref if k.startswith("grad.")]
    missing = [n for n in names if n not in grads]
    if missing:
        fails.append(f"{family}: subtrain gave no gradient {missing}")
        names = [n for n in names if n in grads]
    norm = sum((ref[f"grad.{n}"] ** 2).sum().item() for n in names)
    for key, got in (("grad", lambda n: grads[n]), ("grad32", lambda n: ref[f"grad32.{n}"])):
        diff = sum(((got(n).double() - ref[f"grad.{n}"]) ** 2).sum().item() for n in names)
        r[key] = (diff / norm) ** 0.5
    worst = max((rel(grads[n], ref[f"grad.{n}"]), n) for n in names)
    worst32 = max((rel(ref[f"grad32.{n}"], ref[f"grad.{n}"]), n) for n in names)
    worst_stat, stat_name = 0.0, ""
    for key, want in ref.items():
        if key.startswith("stat."):
            d = rel(grads[key[5:]], want)
            if d >= worst_stat:
                worst_stat, stat_name = d, key[5:]
    extra = [k for k in grads if f"grad.{k}" not in ref and f"stat.{k}" not in ref]
    if extra:
        fails.append(f"{family}: subtrain's gradients hold {extra}, PyTorch's not")
    line = (f"{family:9s} logits eval {r['eval']:.2e} train {r['train']:.2e} "
            f"(float64 {r['eval64']:.2e}), loss {r['loss']:.2e}, "
            f"after a PyTorch step {r['tuned']:.2e}; gradients vs float64 {r['grad']:.2e} "
            f"(PyTorch fp32 {r['grad32']:.2e}), worst of {len(names)} tensors "
            f"{worst[0]:.2e} ({worst[1]}; PyTorch fp32's {worst32[0]:.2e}, {worst32[1]})")
    if stat_name:
        r["stats"] = worst_stat
        line += f"; running statistics after a step {worst_stat:.2e} ({stat_name})"
    print(line)
    for k in ("eval", "train", "loss", "tuned", "grad", "stats"):
        if k in r and not r[k] <= BOUND:
            fails.append(f"{family}: {k} relative difference {r[k]:.3e} > {BOUND:g}")
    # load() takes the torch layout only, and says so
    try:
        st.load(p("source"))
        fails.append(f"{family}: subtrain_torch.load took a subtrain-layout file")
    except ValueError as e:
        if "not in the torch layout" not in str(e):
            fails.append(f"{family}: subtrain_torch.load of a subtrain-layout file: {e}")
    # a flipped bit in the data (subtrain's file) is found by the CRC-32
    with open(p("torch"), "rb") as f:
        damaged = bytearray(f.read())
    damaged[-1] ^= 1
    with open(p("damaged"), "wb") as f:
        f.write(damaged)
    try:
        st.read_safetensors(p("damaged"))
        fails.append(f"{family}: read_safetensors took a file with a flipped bit")
    except ValueError as e:
        if "the file is damaged" not in str(e):
            fails.append(f"{family}: read_safetensors of a damaged file: {e}")
    for a, b, what in (("torch", "resaved", "subtrain -> torch -> torch"),
                       ("source", "back", "subtrain -> torch -> subtrain")):
        why = same_tensors(p(a), p(b), f"{family}: {what}")
        if why:
            fails.append(why)
    return fails


def main(argv):
    torch.set_num_threads(1)
    if argv[0] == "idx":
        idx(argv[1], int(argv[2]))
        return 0
    work, families = argv[1], argv[2:]
    if argv[0] == "prepare":
        for k, f in enumerate(families):
            prepare(work, f, int(os.environ.get("TORCH_INTEROP_SEED", "1000")) + k)
        return 0
    fails = []
    for f in families:
        fails += compare(work, f)
    for f in fails:
        print("FAIL", f)
    if not fails:
        print(f"every difference within {BOUND:g}; every round trip bitwise")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
