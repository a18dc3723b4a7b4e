"""subtrain's models as PyTorch modules, and their weights files.

    import subtrain_torch
    model = subtrain_torch.load("model.safetensors")   # subtrain export --format torch
    ...                                                 # evaluate, fine-tune, publish
    subtrain_torch.save(model, "tuned.safetensors")     # subtrain --init tuned.safetensors

Each module computes what subtrain's model of the same family computes
(doc/interop.md): the same layers in the same order, PyTorch's defaults
where subtrain uses them (layer and batch norm eps 1e-5, batch norm
momentum 0.1 with the unbiased running variance, GELU in its erf form),
and its parameters named and shaped as `subtrain export --format torch`
writes them.  Inputs:

    mlp, resmlp          (B, features) floats (an image is flattened)
    resnet, resnet18,
    convnet              (B, C, H, W) floats
    gpt                  (B, T) byte ids (T <= the context), logits (B, T, 256)
    vit                  (B, C, H, W) floats (H, W: the model's image size)

A file is safetensors (https://github.com/huggingface/safetensors), read
and written here with the standard library and torch alone.  save() writes
the parameters and the batch norms' running statistics (not their
num_batches_tracked, which momentum 0.1 never reads), F32, and in the
metadata the model that load() builds again.
"""

import json
import math
import os
import struct
import sys
import zlib

import torch
from torch import nn
import torch.nn.functional as F

__all__ = ["MLP", "ResMLP", "GPT", "ViT", "ResNet", "ConvNet", "build", "load", "save",
           "read_safetensors", "write_safetensors"]

LAYERNORM_EPS = 1e-5   # nn/layers.h: ST_LAYERNORM_EPS
BATCHNORM_EPS = 1e-5   # ST_BATCHNORM_EPS
BATCHNORM_MOMENTUM = 0.1

# ------------------------------------------------------------------ files

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}
CRC_KEY = "subtrain.crc32"   # subtrain/checkpoint.h: ST_SAFETENSORS_CRC_KEY


def read_safetensors(path):
    """The tensors of a safetensors file (a dict in the header's order) and
    its metadata (a dict of strings)."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors data is little-endian; this machine is not")
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: the header claims {n} bytes; the file has {len(blob) - 8}")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    at = 0
    tensors = {}
    for name, e in entries:
        begin, end = e["data_offsets"]
        dtype = _DTYPES.get(e["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}' has dtype {e['dtype']}")
        shape = list(e["shape"])
        count = math.prod(shape)
        size = torch.tensor([], dtype=dtype).element_size()
        if begin != at or end - begin != count * size or end > len(data):
            raise ValueError(f"{path}: tensor '{name}' has data_offsets [{begin}, {end}] "
                             f"that do not fit its shape {shape} and the data")
        at = end
        if count:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    if at != len(data):
        raise ValueError(f"{path}: {len(data) - at} bytes after the last tensor's data")
    want = meta.get(CRC_KEY)
    if want is not None and f"{zlib.crc32(data):08x}" != want:
        raise ValueError(f"{path}: the data's CRC-32 is {zlib.crc32(data):08x}, the header "
                         f"records {want}: the file is damaged")
    order = list(header)   # the header's order, not the data's
    return {k: tensors[k] for k in order}, dict(meta)


def write_safetensors(path, tensors, metadata=None):
    """Writes a dict of tensors (in its order) and string metadata,
    atomically: a temporary file in the same directory, renamed.  The
    metadata gets the data's CRC-32 (CRC_KEY), as subtrain's writer adds
    it; one carried over from a file read is replaced."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors data is little-endian; this machine is not")
    header = {"__metadata__": {str(k): str(v) for k, v in (metadata or {}).items()}}
    blobs = []
    at = 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor '{name}': dtype {t.dtype} has no safetensors name")
        b = t.numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    crc = 0
    for b in blobs:
        crc = zlib.crc32(b, crc)
    header["__metadata__"][CRC_KEY] = f"{crc:08x}"
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)   # the data 8-byte aligned
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ------------------------------------------------------------------ layers

def _act(name):
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()   # erf form, as oneDNN's gelu_erf
    raise ValueError(f"unknown activation '{name}' (subtrain has relu, gelu)")


class _Config:
    """The metadata keys a module is built from, as attributes."""

    KEYS = ("depth", "width", "hidden", "heads", "context", "in_features", "in_channels",
            "in_height", "in_width", "classes")
    VIT_KEYS = ("patch", "pool")   # a ViT's only: its patch side, mean or cls

    def __init__(self, model, **kw):
        self.model = model
        self.activation = kw.pop("activation", "gelu")
        self.branch_scale = float(kw.pop("branch_scale", 1.0))
        for k in self.KEYS:
            setattr(self, k, int(kw.pop(k, 0)))
        self.patch = int(kw.pop("patch", 0))
        self.pool = kw.pop("pool", "mean")
        if self.pool not in ("mean", "cls"):
            raise ValueError(f"unknown pool '{self.pool}' (subtrain has mean, cls)")
        if kw:
            raise TypeError(f"unknown model options: {', '.join(sorted(kw))}")

    def metadata(self):
        m = {"subtrain.layout": "torch", "subtrain.model": self.model}
        for k in ("depth", "width", "hidden", "heads", "context"):
            m[f"subtrain.{k}"] = str(getattr(self, k))
        m["subtrain.activation"] = self.activation
        for k in ("in_features", "in_channels", "in_height", "in_width", "classes"):
            m[f"subtrain.{k}"] = str(getattr(self, k))
        if self.model == "vit":
            m["subtrain.patch"] = str(self.patch)
            m["subtrain.pool"] = self.pool
        return m


class MLP(nn.Module):
    """x -> [linear -> act] x depth -> head (nn/models/mlp.c)."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        dims = [c.in_features] + [c.width] * c.depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.act = _act(c.activation)
        self.head = nn.Linear(dims[-1], c.classes)

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        for fc in self.hidden:
            x = self.act(fc(x))
        return self.head(x)


class _MLPBranch(nn.Module):
    """fc2(act(fc1(x))), the MLP of a pre-norm residual block."""

    def __init__(self, width, hidden, activation):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = _act(activation)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _ResMLPBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = nn.LayerNorm(c.width, eps=LAYERNORM_EPS)
        self.fc1 = nn.Linear(c.width, c.hidden)
        self.act = _act(c.activation)
        self.fc2 = nn.Linear(c.hidden, c.width)
        self.scale = c.branch_scale

    def forward(self, h):
        branch = self.fc2(self.act(self.fc1(self.norm(h))))
        return h + (branch if self.scale == 1.0 else self.scale * branch)


class ResMLP(nn.Module):
    """stem -> depth x {h += fc2(act(fc1(LN(h))))} -> LN -> head (nn/models/resmlp.c)."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.stem = nn.Linear(c.in_features, c.width)
        self.blocks = nn.ModuleList(_ResMLPBlock(c) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width, eps=LAYERNORM_EPS)
        self.head = nn.Linear(c.width, c.classes)

    def forward(self, x):
        h = self.stem(x.reshape(x.shape[0], -1))
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


class _Attention(nn.Module):
    """Multi-head self-attention: qkv (per token q | k | v, each
    head-major), softmax(Q K^T / sqrt(dh)), causal with -inf above the
    diagonal, then proj (nn/layers/attention.c)."""

    def __init__(self, width, heads, causal=True):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, D = x.shape
        H = self.heads
        dh = D // H
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, dh).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        if self.causal:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        y = (p @ v).transpose(1, 2).reshape(B, T, D)
        return self.proj(y)


class _GPTBlock(nn.Module):
    def __init__(self, c, causal=True):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.width, eps=LAYERNORM_EPS)
        self.attn = _Attention(c.width, c.heads, causal)
        self.ln2 = nn.LayerNorm(c.width, eps=LAYERNORM_EPS)
        self.mlp = _MLPBranch(c.width, c.hidden, c.activation)
        self.scale = c.branch_scale

    def forward(self, h):
        s = self.scale
        a = self.attn(self.ln1(h))
        h = h + (a if s == 1.0 else s * a)
        m = self.mlp(self.ln2(h))
        return h + (m if s == 1.0 else s * m)


class GPT(nn.Module):
    """Byte-level causal transformer, pre-norm blocks, untied head
    (nn/models/gpt.c): (B, T) byte ids -> (B, T, 256) logits of the next
    byte at each position."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.classes, c.width)
        self.pos_emb = nn.Embedding(c.context, c.width)
        self.blocks = nn.ModuleList(_GPTBlock(c) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width, eps=LAYERNORM_EPS)
        self.head = nn.Linear(c.width, c.classes)

    def forward(self, idx):
        idx = idx.long()
        T = idx.shape[1]
        if T > self.config.context:
            raise ValueError(f"{T} tokens; the model's context is {self.config.context}")
        h = self.tok_emb(idx) + self.pos_emb.weight[:T]
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


class _Tokens(nn.Module):
    """A ViT's class token (pool "cls") and learned positions
    (nn/layers/tokens.c)."""

    def __init__(self, width, tokens, cls):
        super().__init__()
        if cls:
            self.cls_token = nn.Parameter(torch.zeros(1, width))
        self.pos_emb = nn.Parameter(torch.zeros(tokens, width))

    def forward(self, h):
        if hasattr(self, "cls_token"):
            h = torch.cat([self.cls_token.expand(h.shape[0], 1, -1), h], dim=1)
        return h + self.pos_emb


class ViT(nn.Module):
    """Vision transformer (nn/models/vit.c): the image's P x P patches
    through Conv2d(C, D, P, stride P), a class token first (pool "cls"),
    learned positions, pre-norm blocks as GPT's without the causal mask,
    LN, the class token or the tokens' mean, the head: (B, C, H, W) ->
    (B, classes)."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        P = c.patch
        if P < 1 or c.in_height % P or c.in_width % P:
            raise ValueError(f"patches of {P} do not tile {c.in_height} x {c.in_width} images")
        tokens = (c.in_height // P) * (c.in_width // P) + (c.pool == "cls")
        self.patch_embed = nn.Conv2d(c.in_channels, c.width, P, stride=P)
        self.tokens = _Tokens(c.width, tokens, c.pool == "cls")
        self.blocks = nn.ModuleList(_GPTBlock(c, causal=False) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width, eps=LAYERNORM_EPS)
        self.head = nn.Linear(c.width, c.classes)

    def forward(self, x):
        c = self.config
        if x.dim() == 2:
            x = x.reshape(x.shape[0], c.in_channels, c.in_height, c.in_width)
        h = self.tokens(self.patch_embed(x).flatten(2).transpose(1, 2))   # row-major patches
        for b in self.blocks:
            h = b(h)
        h = self.norm(h)
        return self.head(h[:, 0] if c.pool == "cls" else h.mean(dim=1))


def _bn(channels):
    return nn.BatchNorm2d(channels, eps=BATCHNORM_EPS, momentum=BATCHNORM_MOMENTUM)


def _conv(cin, cout, k, stride):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class _PreActBlock(nn.Module):
    """act(BN) -> conv 3x3 -> act(BN) -> conv 3x3, plus the skip: the
    input, or at a change of shape a 1x1 projection of the pre-activated
    input (nn/models/resnet.c)."""

    def __init__(self, cin, c, stride, activation, scale):
        super().__init__()
        self.bn0 = _bn(cin)
        self.conv1 = _conv(cin, c, 3, stride)
        self.bn1 = _bn(c)
        self.conv2 = _conv(c, c, 3, 1)
        self.shortcut = _conv(cin, c, 1, stride) if stride != 1 or cin != c else None
        self.act = _act(activation)
        self.scale = scale

    def forward(self, h):
        p = self.act(self.bn0(h))
        c2 = self.conv2(self.act(self.bn1(self.conv1(p))))
        if self.shortcut is not None:
            return self.shortcut(p) + c2
        return h + (c2 if self.scale == 1.0 else self.scale * c2)


class ResNet(nn.Module):
    """Pre-activation ResNet: stem conv 3x3 -> stages of blocks (width,
    2 width, ...; the first block of each stage but the first halves the
    image) -> act(BN) -> global average pool -> head.  resnet: 3 stages of
    depth blocks; resnet18: 4 stages of 2."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        stages, blocks = (4, 2) if c.model == "resnet18" else (3, c.depth)
        self.stem = _conv(c.in_channels, c.width, 3, 1)
        self.stages = nn.ModuleList()
        cin = c.width
        for s in range(stages):
            cs = c.width << s
            self.stages.append(nn.Sequential(*(
                _PreActBlock(cin if b == 0 else cs, cs, 2 if s > 0 and b == 0 else 1,
                             c.activation, c.branch_scale) for b in range(blocks))))
            cin = cs
        self.norm = _bn(cin)
        self.act = _act(c.activation)
        self.head = nn.Linear(cin, c.classes)

    def forward(self, x):
        c = self.config
        if x.dim() == 2:
            x = x.reshape(x.shape[0], c.in_channels, c.in_height, c.in_width)
        h = self.stem(x)
        for stage in self.stages:
            h = stage(h)
        return self.head(self.act(self.norm(h)).mean(dim=(2, 3)))


class _ConvStage(nn.Module):
    def __init__(self, cin, c, activation):
        super().__init__()
        self.conv = _conv(cin, c, 3, 1)
        self.bn = _bn(c)
        self.act = _act(activation)
        self.pool = nn.MaxPool2d(2, 2)

    def forward(self, x):
        return self.pool(self.act(self.bn(self.conv(x))))


class ConvNet(nn.Module):
    """depth stages {conv 3x3 -> BN -> act -> max pool 2x2}, width x 2^s
    channels -> global average pool -> head (nn/models/convnet.c)."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        chans = [c.in_channels] + [c.width << s for s in range(c.depth)]
        self.stages = nn.ModuleList(_ConvStage(a, b, c.activation)
                                    for a, b in zip(chans, chans[1:]))
        self.head = nn.Linear(chans[-1], c.classes)

    def forward(self, x):
        c = self.config
        if x.dim() == 2:
            x = x.reshape(x.shape[0], c.in_channels, c.in_height, c.in_width)
        for s in self.stages:
            x = s(x)
        return self.head(x.mean(dim=(2, 3)))


_FAMILIES = {"mlp": MLP, "resmlp": ResMLP, "gpt": GPT, "resnet": ResNet, "resnet18": ResNet,
             "convnet": ConvNet, "vit": ViT}

# What a file says of the weights' making, kept through load() and save().
_PROVENANCE = ("subtrain.config", "subtrain.data", "onednn.version",
               "subtrain.eval_branch_scale")


def build(model, **options):
    """A module of subtrain's family `model` with fresh weights, e.g.
    build("resmlp", depth=2, width=64, hidden=64, in_features=784,
    classes=10, activation="gelu")."""
    if model not in _FAMILIES:
        raise ValueError(f"unknown model '{model}' (subtrain has {', '.join(_FAMILIES)})")
    return _FAMILIES[model](_Config(model, **options))


def _config_of(meta, path):
    if meta.get("subtrain.layout") != "torch":
        raise ValueError(f"{path}: not in the torch layout (its subtrain.layout is "
                         f"{meta.get('subtrain.layout')!r}): `subtrain export --format torch` "
                         f"writes one")
    kw = {}
    for k in _Config.KEYS:
        if f"subtrain.{k}" not in meta:
            raise ValueError(f"{path}: no subtrain.{k} in its metadata")
        kw[k] = int(meta[f"subtrain.{k}"])
    if meta.get("subtrain.model") == "vit":
        for k in _Config.VIT_KEYS:
            if f"subtrain.{k}" not in meta:
                raise ValueError(f"{path}: no subtrain.{k} in its metadata")
        kw["patch"] = int(meta["subtrain.patch"])
        kw["pool"] = meta["subtrain.pool"]
    scale = float(meta.get("subtrain.eval_branch_scale", "1"))
    kw["branch_scale"] = scale if 0.0 < scale < 1.0 else 1.0
    return meta.get("subtrain.model"), meta.get("subtrain.activation", "gelu"), kw


def _state(module):
    """The tensors a file holds: the state_dict less num_batches_tracked."""
    return {k: v for k, v in module.state_dict().items() if not k.endswith("num_batches_tracked")}


def load(path):
    """The module a torch-layout file describes, with its weights (and
    running statistics, when the file has them).  Like any torch module it
    starts in training mode: call .eval() to evaluate."""
    tensors, meta = read_safetensors(path)
    model, activation, kw = _config_of(meta, path)
    module = build(model, activation=activation, **kw)
    want = _state(module)
    for name in tensors:
        if name not in want:
            raise ValueError(f"{path}: tensor '{name}' is not in a {model} of this size")
    stats = [k for k in want if k.endswith(("running_mean", "running_var"))]
    held = [k for k in stats if k in tensors]
    if held and len(held) != len(stats):
        missing = next(k for k in stats if k not in tensors)
        raise ValueError(f"{path}: running statistics in part: no '{missing}'")
    for name, t in want.items():
        if name in stats and not held:
            continue
        if name not in tensors:
            raise ValueError(f"{path}: no tensor '{name}' (of shape {list(t.shape)})")
        if tensors[name].shape != t.shape or tensors[name].dtype != torch.float32:
            raise ValueError(f"{path}: tensor '{name}' is {tensors[name].dtype} "
                             f"{list(tensors[name].shape)}, the module's float32 "
                             f"{list(t.shape)}")
    module.load_state_dict(tensors, strict=False)
    module.subtrain_metadata = {k: meta[k] for k in _PROVENANCE if k in meta}
    return module


def save(module, path):
    """A file `subtrain --init` and `subtrain eval --init` read (and load()
    reads back): the parameters and running statistics in float32, in the
    torch layout, and the model in the metadata."""
    if not hasattr(module, "config") or module.config.model not in _FAMILIES:
        raise TypeError("save() takes a module of subtrain_torch (build() or load())")
    meta = dict(getattr(module, "subtrain_metadata", {}))
    meta.update(module.config.metadata())
    return write_safetensors(path, {k: v.detach().to(torch.float32)
                                    for k, v in _state(module).items()}, meta)
