"""Shrunk real checkpoints: a Hugging Face checkpoint directory with a real model's field set, key names, special-token
ids, chat template and (where the source has them) tokenizer files, at a size a CPU runs in seconds; weights random.

The paper path is tested on these, as torchtune, verl and TRL test their recipes on tiny random checkpoints of the
real architecture: every config field the real checkpoint has is kept (only sizes change), the vocabulary is kept
whole (so the real tokenizer and special ids stay valid), and the weights carry the official state-dict names.

    dare-bench checkpoint shrink LLaDA-8B-Instruct OUT --layers 2 --hidden 256       # a shipped config.json
    dare-bench checkpoint shrink path/to/Dream-v0-Instruct-7B OUT                    # a metadata dir: + tokenizer
    python -c "from dare_bench.models.shrink import shrink_checkpoint; shrink_checkpoint('SDAR-4B-Chat', 'out')"

Tokenizer: copied when the source dir has its files (Dream, SDAR ship Qwen2 BPE). LLaDA's and LLaDA2's real
`tokenizer.json` are not shipped (over the size the metadata copies keep), and a checkpoint without a tokenizer cannot
run the paper path (chat template, prompts, decoding). So a *stand-in* is written instead (`standin_tokenizer`): a
real `transformers` fast tokenizer (byte-level BPE without merges: every UTF-8 byte is a token, so any text
round-trips exactly) whose special tokens sit at the checkpoint's REAL ids — from the shipped tokenizer_config.json
`added_tokens_decoder` (LLaDA: all 269, mask `<|mdm_mask|>` 126336, eos 126081, `<|eot_id|>` 126348) and from the
model's own special ids (LLaDA2: eos / pad `<|endoftext|>` 156892, mask `<|mask|>` 156895) — and every other id up to
`vocab_size - 1` a filler token, so `len(tokenizer) == vocab_size` and whatever id a random-weights model samples
decodes. Sampling, masking and stopping therefore see the ids the real model does; the shipped tokenizer_config.json
(chat template, token roles) is kept byte for byte. Not the real tokenizer: ordinary text splits into bytes (about
4x the real token count); special tokens named by a role whose real id no shipped file states (LLaDA2's bos,
`[CLS]`, `[gMASK]`) sit at stand-in ids counted down from `vocab_size - 1`; template markup no file marks as a token
(LLaDA2's `<role>`, `<|role_end|>`) is plain text. The dir's STANDIN_TOKENIZER.md says so.

Sizes: `hidden` with the real head_dim (so heads = hidden / head_dim), kv heads in the real ratio (at least 1),
MLP widths scaled with hidden, MoE backbones with `experts` routed experts (default 2 x the real top-k, keeping
top-k and the routing groups' semantics).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch

from dare_bench.errors import CheckpointError
from dare_bench.fileio import atomic_directory

# Files of a checkpoint dir that describe weights: never copied from the source, since the shrunk weights replace them.
WEIGHT_FILES = ("config.json", "model.safetensors.index.json")


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


# Config field names of each family's sizes (the official configs name them differently).
SIZE_FIELDS = {
    "llada": dict(hidden="d_model", layers="n_layers", heads="n_heads", kv_heads="n_kv_heads", ffn="mlp_hidden_size"),
    "dream": dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                  kv_heads="num_key_value_heads", ffn="intermediate_size"),
    "sdar": dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                 kv_heads="num_key_value_heads", ffn="intermediate_size"),
    "llada2": dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                   kv_heads="num_key_value_heads", ffn="intermediate_size"),
}


def shrunk_config(config: dict[str, Any], family: str, *, layers: int = 2, hidden: int = 256,
                  experts: int | None = None) -> dict[str, Any]:
    """The real config with sizes replaced; every other field (ids, rope, norms, MoE routing) is kept."""
    if family not in SIZE_FIELDS:
        raise CheckpointError(f"cannot shrink a {family!r} checkpoint (families: {', '.join(SIZE_FIELDS)})")
    if layers < 1 or hidden < 8:
        raise CheckpointError(f"--layers must be >= 1 and --hidden >= 8 (got {layers}, {hidden})")
    f = SIZE_FIELDS[family]
    out = dict(config)
    real_hidden, real_heads = config[f["hidden"]], config[f["heads"]]
    head_dim = config.get("head_dim") or real_hidden // real_heads
    if hidden % head_dim:
        raise CheckpointError(f"--hidden {hidden} is not a multiple of the real head_dim {head_dim}")
    heads = hidden // head_dim
    real_kv = config.get(f["kv_heads"]) or real_heads
    kv_heads = max(1, heads * real_kv // real_heads)
    while heads % kv_heads:
        kv_heads -= 1
    scale = hidden / real_hidden
    out.update({f["hidden"]: hidden, f["layers"]: layers, f["heads"]: heads, f["kv_heads"]: kv_heads})
    if config.get(f["ffn"]):
        out[f["ffn"]] = _round_to(config[f["ffn"]] * scale, 64)
    if family == "llada" and "mlp_ratio" in config and not config.get("mlp_hidden_size"):
        out["mlp_hidden_size"] = hidden * config["mlp_ratio"]
    if "max_window_layers" in config:  # Qwen-style "first N layers without sliding window": all of them
        out["max_window_layers"] = layers
    if config.get("num_experts"):
        top_k = config["num_experts_per_tok"]
        n_experts = experts or 2 * top_k
        if n_experts < top_k:
            raise CheckpointError(f"--experts {n_experts} is below the real top-k {top_k}")
        out["num_experts"] = n_experts
        if config.get("moe_intermediate_size"):
            out["moe_intermediate_size"] = _round_to(config["moe_intermediate_size"] * scale, 32)
        groups = config.get("n_group")
        if groups:
            if n_experts % groups:
                raise CheckpointError(f"--experts {n_experts} must be a multiple of the {groups} routing groups")
            if config.get("topk_group", groups) * (n_experts // groups) < top_k:
                raise CheckpointError(f"--experts {n_experts}: {config['topk_group']} groups of "
                                      f"{n_experts // groups} cannot hold the top-{top_k} experts")
        if "first_k_dense_replace" in config:
            out["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers - 1 if layers > 1 else 0)
    if "rotary_dim" in config and config.get("partial_rotary_factor"):
        out["rotary_dim"] = int(head_dim * config["partial_rotary_factor"])
    return out


def _source(source: str | Path) -> tuple[dict[str, Any], Path | None]:
    """config.json of a checkpoint / metadata dir, or of a shipped real config by name; and the dir (or None)."""
    p = Path(source).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.exists():
            raise CheckpointError(f"{p}: no config.json")
        try:
            return json.loads(cfg.read_text()), p
        except ValueError as exc:
            raise CheckpointError(f"{cfg}: not valid JSON ({exc})") from None
    from dare_bench.models.real_configs import real_config

    # a shipped name: its config, and its shipped tokenizer metadata (chat template, special tokens) when there is one
    metadata = Path(__file__).resolve().parent / "checkpoint_metadata" / str(source)
    return real_config(str(source))[1], (metadata if metadata.is_dir() else None)


def shrink_checkpoint(source: str | Path, out: str | Path, *, layers: int = 2, hidden: int = 256,
                      experts: int | None = None, seed: int = 0, dtype: str = "bfloat16") -> dict[str, Any]:
    """Write the shrunk checkpoint to `out` (atomically; an existing `out` is refused). Returns a summary."""
    from dare_bench.models.families import detect_family
    from dare_bench.models.io import build_model, resolve_dtype, save_pretrained

    out = Path(out).expanduser()
    if out.exists():
        raise CheckpointError(f"{out} exists; choose a new directory")
    config, source_dir = _source(source)
    family = detect_family(config, str(source)).name
    small = shrunk_config(config, family, layers=layers, hidden=hidden, experts=experts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(small, device="cpu", dtype=torch.float32, source=str(source))
        model.init_weights()
    model = model.to(resolve_dtype(dtype))
    copied = []
    has_tokenizer = source_dir is not None and any(
        (source_dir / f).exists() for f in ("tokenizer.json", "vocab.json", "tokenizer.model"))
    with atomic_directory(out) as tmp:
        save_pretrained(model, tmp / "model")
        for f in (tmp / "model").iterdir():
            f.rename(tmp / f.name)
        (tmp / "model").rmdir()
        if source_dir is not None:  # tokenizer, chat template, generation config: unchanged
            for f in sorted(source_dir.iterdir()):
                if f.is_file() and f.name not in WEIGHT_FILES and not f.name.endswith(".safetensors"):
                    shutil.copy2(f, tmp / f.name)
                    copied.append(f.name)
        if not has_tokenizer:
            write_standin_tokenizer(model, source_dir, tmp)
    n = model.num_parameters()
    return {"family": family, "directory": str(out), "parameters": n, "layers": layers, "hidden": hidden,
            "experts": small.get("num_experts"), "copied": copied,
            "tokenizer": "copied" if has_tokenizer else "stand-in",
            "embedding_share": round(_embedding_params(small, family) / n, 3) if n else math.nan}


def _embedding_params(config: dict[str, Any], family: str) -> int:
    hidden = config[SIZE_FIELDS[family]["hidden"]]
    vocab = config.get("embedding_size") or config["vocab_size"]
    tied = config.get("tie_word_embeddings") or config.get("weight_tying")
    return vocab * hidden * (1 if tied else 2)


# --- the stand-in tokenizer (see the module docstring) -------------------------------------------------------------

STANDIN_NOTE = """# Stand-in tokenizer

The real tokenizer files of this checkpoint are not shipped with dare-bench, so `dare-bench checkpoint shrink` wrote
`tokenizer.json`: a byte-level BPE without merges (every UTF-8 byte is one token; any text round-trips exactly) whose
special tokens sit at the real checkpoint's ids, with filler tokens on every other id up to vocab_size - 1.
Special tokens at their real ids: {real}.
At stand-in ids (no shipped file states the real one): {standin}.
Use it to exercise the paper path on CPU (chat template, masking, sampling, stopping); never to score a model.
"""


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte 0..255 (what ByteLevel uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def standin_tokenizer(model, metadata_dir: Path | None):
    """A `tokenizers.Tokenizer` for `model` (its config's vocab_size and special ids) and the shipped metadata.

    Returns (tokenizer, real, standin): `real` maps the tokens placed at their real ids, `standin` those placed at
    stand-in ids (token -> id)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab_size = int(model.config["vocab_size"])
    meta: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # tokenizer_config wins, as in transformers
        f = metadata_dir / name if metadata_dir is not None else None
        if f is not None and f.exists():
            meta.update(json.loads(f.read_text()))
    at: dict[int, dict[str, Any]] = {}  # id -> added-token fields
    for i, tok in (meta.get("added_tokens_decoder") or {}).items():
        at[int(i)] = {"content": tok["content"], "special": tok.get("special", True)}
    traits = model.traits
    roles = {"mask": traits.mask_token_id, "eos": traits.eos_token_id, "pad": traits.pad_token_id,
             "bos": traits.bos_token_id}
    by_content = {v["content"]: i for i, v in at.items()}
    for role, tid in roles.items():
        content = _content(meta.get(f"{role}_token"))
        if tid is None or int(tid) in at:
            continue
        if content is None:
            content = {"mask": "<|mask|>", "eos": "<|endoftext|>", "pad": "<|endoftext|>",
                       "bos": "<|startoftext|>"}[role]
        if content in by_content and by_content[content] != int(tid):
            raise CheckpointError(f"{metadata_dir}: {role} token {content!r} has id {by_content[content]} in the "
                                  f"tokenizer metadata but {tid} in the model config")
        at[int(tid)] = {"content": content, "special": True}
        by_content[content] = int(tid)
    real = {v["content"]: i for i, v in at.items()}
    wanted = [_content(v) for k, v in meta.items() if k.endswith("_token") and _content(v)]
    wanted += [_content(v) for v in meta.get("additional_special_tokens") or [] if _content(v)]
    standin: dict[str, int] = {}
    free = vocab_size - 1
    for content in dict.fromkeys(wanted):  # role tokens whose real id no shipped file states: from the top down
        if content in by_content:
            continue
        while free in at:
            free -= 1
        at[free] = {"content": content, "special": True}
        by_content[content] = standin[content] = free
    alphabet = _bytes_to_unicode()
    clash = sorted(i for i in at if i < len(alphabet) or i >= vocab_size)
    if clash:
        raise CheckpointError(f"special id(s) {clash[:5]} fall on the stand-in's byte tokens or outside the "
                              f"vocabulary of {vocab_size}")
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for i in range(len(alphabet), vocab_size):
        vocab[at[i]["content"] if i in at else f"<|standin_{i}|>"] = i
    if len(vocab) != vocab_size:
        raise CheckpointError("the tokenizer metadata names one special token at two ids")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # in the model's vocabulary already, so they keep their ids; added, so text spelling them maps to one id
    tok.add_special_tokens([AddedToken(v["content"], special=True, normalized=False)
                            for _, v in sorted(at.items()) if v["special"]])
    tok.add_tokens([AddedToken(v["content"], special=False, normalized=False)
                    for _, v in sorted(at.items()) if not v["special"]])
    return tok, real, standin


def write_standin_tokenizer(model, metadata_dir: Path | None, out: Path) -> None:
    """tokenizer.json (+ a tokenizer_config.json naming the special tokens when the source has none) and
    STANDIN_TOKENIZER.md into `out`."""
    tok, real, standin = standin_tokenizer(model, metadata_dir)
    tok.save(str(out / "tokenizer.json"))
    if not (out / "tokenizer_config.json").exists():
        traits = model.traits
        names = {v: k for k, v in real.items()}
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
               "eos_token": names[traits.eos_token_id], "pad_token": names[traits.pad_token_id],
               "mask_token": names[traits.mask_token_id]}
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: kv[1])) or "none"
    (out / "STANDIN_TOKENIZER.md").write_text(STANDIN_NOTE.format(real=fmt(real), standin=fmt(standin)))
