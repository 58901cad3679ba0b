"""Load and validate `reproductions/*.yaml` into `ReproductionSpec`s, with shared defaults and precise errors.

    from dare_bench.registry import load_registry, get
    reg = load_registry()                     # or load_registry("path/to/reproductions")
    spec = reg.get("bgpo-llada-sudoku")       # unknown names suggest the closest ones
    reg.select(backbone="llada", task="gsm8k")

Where the files are: an explicit directory, else `DARE_BENCH_REPRODUCTIONS`, else the registry shipped inside the
package (`dare_bench/reproductions/`: the same files in a checkout, an editable install and a wheel).

Defaults: every reproduction is merged over these layers (later wins; missing files are skipped), all under
`<dir>/_defaults/`:
    common.yaml, kinds/<kind>.yaml (kind = the catalogue's kind of the algorithm: none | sft | preference | rl),
    tasks/<task>.yaml, backbones/<backbone>.yaml, algorithms/<algorithm>.yaml,
    backbone-tasks/<backbone>-<task>.yaml, algorithm-backbones/<algorithm>-<backbone>.yaml, then the file itself.
A scale whose `train.kind` is `none` (baselines) keeps only the train keys set in its own file.
Mappings merge key by key; lists and scalars replace. Under `scales:`, two pseudo-scales hold settings shared by
several scales: `real` (paper and official) and `replica` (tiny and micro). Within one file a named scale's keys
win over its pseudo-scale; across files only the layer order counts. `real` never creates `official`: that
scale exists only where some layer names it.

Errors name the file and line that set the offending value (a default file when the value came from there),
and suggest the closest valid key or value. Strings in defaults may use `{algorithm}`, `{backbone}`, `{task}`
and `{name}`, filled in per reproduction.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from dare_bench import catalogue
from dare_bench.config import ReproductionSpec, deep_merge, scale_refusal
from dare_bench.errors import ConfigError

PSEUDO_SCALES = {"real": ("paper", "official"), "replica": ("tiny", "micro")}
Path_ = tuple  # a location inside a document: keys and list indices

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def default_directory() -> Path:
    env = os.environ.get("DARE_BENCH_REPRODUCTIONS")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[1] / "reproductions"


# ------------------------------------------------------------------------------------ YAML with lines


@dataclass
class Document:
    data: Any
    where: dict[Path_, str] = field(default_factory=dict)  # path -> "file:line"


def parse_yaml(text: str, filename: str) -> Document:
    """Parse one YAML document keeping the line of every key and list item; duplicate keys are errors."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Document({})
        where: dict[Path_, str] = {(): f"{filename}:{node.start_mark.line + 1}"}
        data = _convert(loader, node, (), where, filename)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{filename}{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{filename}: malformed YAML: {exc}") from None
    finally:
        loader.dispose()
    return Document(data, where)


def _convert(loader: Any, node: yaml.Node, path: Path_, where: dict, filename: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise ConfigError(f"{filename}:{key_node.start_mark.line + 1}: mapping keys must be plain values")
            if key in out:
                raise ConfigError(
                    f"{filename}:{key_node.start_mark.line + 1}: duplicate key {key!r} "
                    f"(first at line {where[path + (key,)].rsplit(':', 1)[1]})"
                )
            where[path + (key,)] = f"{filename}:{key_node.start_mark.line + 1}"
            out[key] = _convert(loader, value_node, path + (key,), where, filename)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            where[path + (i,)] = f"{filename}:{item.start_mark.line + 1}"
            items.append(_convert(loader, item, path + (i,), where, filename))
        return items
    return loader.construct_object(node, deep=True)


# -------------------------------------------------------------------------------------------- merging


@functools.lru_cache(maxsize=256)
def _read_layer(path: str, mtime: float) -> Document:
    return parse_yaml(Path(path).read_text(encoding="utf-8"), path)


def _layer(path: Path) -> Document | None:
    if not path.is_file():
        return None
    return _read_layer(str(path), path.stat().st_mtime)


def _merge_docs(docs: list[Document]) -> Document:
    data: Any = {}
    where: dict[Path_, str] = {}
    for doc in docs:
        if not isinstance(doc.data, dict):
            raise ConfigError(f"{doc.where.get((), '?')}: the top level must be a mapping")
        data = deep_merge(data, doc.data)
        for p, loc in doc.where.items():
            if p:
                where[p] = loc
    return Document(data, where)


def _expand_pseudo_scales(doc: Document, official: bool) -> Document:
    """Merge this document's `real` / `replica` sections under its own named scales (named keys win).

    Done per layer, before layers merge, so the layer order alone decides precedence. `real` reaches
    `official` only when some layer names that scale.
    """
    scales = doc.data.get("scales") if isinstance(doc.data, dict) else None
    if not isinstance(scales, dict) or not any(k in PSEUDO_SCALES for k in scales):
        return doc
    out = {k: v for k, v in scales.items() if k not in PSEUDO_SCALES}
    where = {p: loc for p, loc in doc.where.items() if not (len(p) >= 2 and p[0] == "scales" and p[1] in PSEUDO_SCALES)}
    for pseudo, members in PSEUDO_SCALES.items():
        shared = scales.get(pseudo)
        if shared is None:
            continue
        for scale in members:
            if scale == "official" and not official:
                continue
            out[scale] = deep_merge(shared, out[scale]) if isinstance(out.get(scale), dict) else shared
            for p, loc in doc.where.items():
                if len(p) >= 2 and p[:2] == ("scales", pseudo):
                    where.setdefault(("scales", scale) + p[2:], loc)
    return Document({**doc.data, "scales": out}, where)


def _names_official(doc: Document) -> bool:
    scales = doc.data.get("scales") if isinstance(doc.data, dict) else None
    return isinstance(scales, dict) and "official" in scales


def _fill(obj: Any, values: dict[str, str]) -> Any:
    """Defaults may say `{algorithm}`, `{backbone}`, `{task}` or `{name}` in strings (e.g. sampler preset names)."""
    if isinstance(obj, dict):
        return {k: _fill(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, values) for v in obj]
    if isinstance(obj, str) and "{" in obj:
        for key, value in values.items():
            obj = obj.replace("{" + key + "}", str(value))
    return obj


def _untrained(doc: Document, own: Document) -> Document:
    """Scales with `train.kind: none` keep only the train keys their own file sets: a baseline trains nothing,
    so the training defaults of its task and backbone do not belong in its config (or its hash)."""
    scales = doc.data.get("scales")
    if not isinstance(scales, dict):
        return doc
    own_scales = own.data.get("scales") if isinstance(own.data.get("scales"), dict) else {}
    out = dict(scales)
    for name, prof in scales.items():
        train = prof.get("train") if isinstance(prof, dict) else None
        if isinstance(train, dict) and train.get("kind") == "none":
            own_train = (own_scales.get(name) or {}).get("train") or {}
            out[name] = {**prof, "train": {"kind": "none", **own_train}}
    return Document({**doc.data, "scales": out}, doc.where)


def _offered_scales(doc: Document, own: Document, task_name: str) -> Document:
    """Drop the scales the defaults layers give but the task does not offer (`Task.scales`: gsm8k has no tiny
    scale, arith no paper scale). A reproduction file that names such a scale itself is refused, at its line."""
    from dare_bench.tasks import get_task, list_tasks

    scales = doc.data.get("scales")
    if task_name not in list_tasks() or not isinstance(scales, dict):
        return doc  # an unknown task: the schema reports it with the valid names
    task = get_task(task_name)
    own_scales = own.data.get("scales") if isinstance(own.data.get("scales"), dict) else {}
    for name in own_scales:
        if name in ("paper", "official", "tiny", "micro") and not task.offers_scale(name):
            where = own.where.get(("scales", name), "")
            refusal = scale_refusal(task, name, own.data.get("algorithm", "<algorithm>"),
                                    own.data.get("backbone", "<backbone>"))
            raise ConfigError(f"{where}: scales.{name}: {refusal}")
    kept = {name: prof for name, prof in scales.items() if task.offers_scale(name)}
    return Document({**doc.data, "scales": kept}, doc.where)


def layer_paths(directory: Path, algorithm: str, backbone: str, task: str) -> list[Path]:
    d = directory / "_defaults"
    spec = catalogue.algorithms().get(algorithm)
    # an unknown algorithm still loads its other layers; the schema then reports the name with the valid ones
    kind = spec.kind if spec is not None else "unknown"
    return [
        d / "common.yaml",
        d / "kinds" / f"{kind}.yaml",
        d / "tasks" / f"{task}.yaml",
        d / "backbones" / f"{backbone}.yaml",
        d / "algorithms" / f"{algorithm}.yaml",
        d / "backbone-tasks" / f"{backbone}-{task}.yaml",
        d / "algorithm-backbones" / f"{algorithm}-{backbone}.yaml",
    ]


def load_file(path: str | Path, directory: str | Path | None = None) -> ReproductionSpec:
    """Load one reproduction file merged over its defaults (from `directory`, default: the file's folder)."""
    path = Path(path)
    directory = Path(directory) if directory is not None else path.parent
    try:
        own = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if not isinstance(own.data, dict):
        raise ConfigError(f"{path}:1: a reproduction file must be a mapping")
    ident = {}
    for key in ("algorithm", "backbone", "task"):
        value = own.data.get(key)
        if not isinstance(value, str):
            raise ConfigError(
                f"{own.where.get((key,), f'{path}:1')}: `{key}` must be set (a string) in the file itself"
            )
        ident[key] = value
    layers = [doc for p in layer_paths(directory, **ident) if (doc := _layer(p)) is not None]
    layers = [Document(_fill(doc.data, {**ident, "name": own.data.get("name", "")}), doc.where) for doc in layers]
    official = any(_names_official(d) for d in [*layers, own])
    own = _expand_pseudo_scales(own, official)
    merged = _untrained(_merge_docs([*(_expand_pseudo_scales(d, official) for d in layers), own]), own)
    merged = _offered_scales(merged, own, ident["task"])
    try:
        return ReproductionSpec.model_validate(merged.data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, merged, str(path))) from None


# --------------------------------------------------------------------------------------- error messages


def _explain(exc: ValidationError, doc: Document, filename: str) -> str:
    lines = []
    for err in exc.errors()[:3]:
        loc = tuple(err["loc"])
        msg = err["msg"]
        m = re.match(r"Value error, ([\w.\-]+): (.*)", msg, re.S)
        if m and not loc:
            loc = tuple(int(p) if p.isdigit() else p for p in m.group(1).split("."))
            msg = m.group(2)
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        where = _locate(loc, doc, filename)
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        lines.append(f"{where}: {dotted}: {msg}{_hint(err, loc)}")
    more = exc.error_count() - len(lines)
    return "\n".join(lines) + (f"\n(+{more} more errors)" if more > 0 else "")


def _locate(loc: tuple, doc: Document, filename: str) -> str:
    # pydantic adds synthetic parts ('[key]', union member names); the longest real prefix is what the YAML has.
    for n in range(len(loc), 0, -1):
        hit = doc.where.get(loc[:n])
        if hit:
            return hit
    return f"{filename}:1"


def _hint(err: dict, loc: tuple) -> str:
    if err["type"] == "extra_forbidden" and loc:
        options = _fields_at(loc[:-1])
        hits = difflib.get_close_matches(str(loc[-1]), options, n=1, cutoff=0.5)
        if hits:
            return f" (did you mean {hits[0]!r}?)"
        return f" (allowed: {', '.join(options)})" if options else ""
    if err["type"] in ("literal_error", "enum") and "expected" in err.get("ctx", {}):
        options = re.findall(r"'([^']*)'", str(err["ctx"]["expected"]))
        hits = difflib.get_close_matches(str(err.get("input")), options, n=1, cutoff=0.5)
        if hits:
            return f" (did you mean {hits[0]!r}?)"
    return ""


def _fields_at(loc: tuple) -> list[str]:
    """Field names of the schema model found at `loc` inside ReproductionSpec (empty if not a model)."""
    current: Any = ReproductionSpec
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            f = current.model_fields.get(str(part))
            if f is None:
                return []
            current = f.annotation
            continue
        origin = get_origin(current)
        if origin in (dict, list, tuple):
            current = get_args(current)[-1] if get_args(current) else Any
            continue
        return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(tp: Any) -> Any:
    if get_origin(tp) is Union or type(tp).__name__ == "UnionType":
        models = [a for a in get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
        others = [a for a in get_args(tp) if a is not type(None)]
        return models[0] if models else (others[0] if len(others) == 1 else tp)
    return tp


# -------------------------------------------------------------------------------------------- registry


class Registry:
    """Every reproduction of one directory, validated; names are unique."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else default_directory()
        if not self.directory.is_dir():
            raise ConfigError(
                f"reproductions directory {self.directory} does not exist "
                "(set DARE_BENCH_REPRODUCTIONS or pass a directory)"
            )
        self.specs: dict[str, ReproductionSpec] = {}
        self.files: dict[str, Path] = {}
        loaded = [(path, load_file(path, self.directory)) for path in sorted(self.directory.glob("*.yaml"))]
        for path, spec in loaded:
            if spec.name in self.specs:
                raise ConfigError(
                    f"{path}: duplicate reproduction name {spec.name!r} (also in {self.files[spec.name]})"
                )
            self.specs[spec.name] = spec
            self.files[spec.name] = path
        for path, spec in loaded:
            if path.stem != spec.name:
                raise ConfigError(f"{path}: file name must be the reproduction name: {spec.name}.yaml")

    def __len__(self) -> int:
        return len(self.specs)

    def __iter__(self):
        return iter(self.specs.values())

    def names(self) -> list[str]:
        return sorted(self.specs)

    def get(self, name: str) -> ReproductionSpec:
        if name not in self.specs:
            hits = difflib.get_close_matches(name, self.specs, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(hits)}?" if hits else f" ({len(self.specs)} known: `dare-bench list`)"
            raise ConfigError(f"unknown reproduction {name!r}{hint}")
        return self.specs[name]

    def select(self, *, backbone: str | Iterable[str] | None = None, algorithm: str | Iterable[str] | None = None,
               task: str | Iterable[str] | None = None) -> list[ReproductionSpec]:
        """Entries whose backbone, algorithm and task are among the given ones; each filter is one name, a comma
        list ("llada,dream") or several of either (`--backbone llada --backbone dream`); None keeps all."""
        wanted = {}
        for what, value, known in (("backbone", backbone, catalogue.backbone_names()),
                                   ("algorithm", algorithm, catalogue.algorithm_names()),
                                   ("task", task, catalogue.task_names())):
            names = split_names(value)
            for name in names or ():
                if name not in known:
                    hits = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
                    hint = f"; did you mean {hits[0]!r}?" if hits else f" (known: {', '.join(known)})"
                    raise ConfigError(f"unknown {what} {name!r}{hint}")
            wanted[what] = names
        return [
            s for name, s in sorted(self.specs.items())
            if all(names is None or getattr(s, what) in names for what, names in wanted.items())
        ]


def split_names(value: str | Iterable[str] | None) -> list[str] | None:
    """"a,b" / ["a", "b,c"] -> the names in order; None (or nothing named) -> None, meaning no filter."""
    if value is None:
        return None
    parts = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for part in parts for n in part.split(",") if n.strip()]
    return names or None


_CACHE: dict[str, tuple[tuple, Registry]] = {}


def _yaml_stamp(directory: Path) -> tuple:
    """Every YAML under `directory` with its mtime: the registry reloads when it changes. Checked on every
    `load_registry`, so os.walk (twice as fast as Path.rglob on the ~400 entries)."""
    found = []
    for root, _, files in os.walk(directory):
        found.extend((path, os.stat(path).st_mtime_ns) for path in (os.path.join(root, f) for f in files)
                     if path.endswith(".yaml"))
    return tuple(sorted(found))


def load_registry(directory: str | Path | None = None) -> Registry:
    """The registry of `directory` (see module docstring), reloaded when any YAML under it changes."""
    d = Path(directory).expanduser() if directory is not None else default_directory()
    key = str(d.resolve())
    stamp = _yaml_stamp(d) if d.is_dir() else ()
    hit = _CACHE.get(key)
    if hit and hit[0] == stamp:
        return hit[1]
    reg = Registry(d)
    _CACHE[key] = (stamp, reg)
    return reg


def get(name: str, directory: str | Path | None = None) -> ReproductionSpec:
    return load_registry(directory).get(name)
