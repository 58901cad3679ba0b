"""The catalogue: every algorithm, backbone and task the benchmark knows, declared once and importable without torch.

Everything that needs a list of names or a fact about one reads it from here: the reproduction schema
(`config.py`: the `algorithm` / `backbone` / `task` literals, knob validation), the registry (defaults layers,
`select`), `dare-bench list`, the pipeline (plug-in lookup, algorithm x backbone check) and the plug-in registry.

    from dare_bench import catalogue
    spec = catalogue.algorithm("coupled-grpo")   # AlgorithmSpec(name, kind, knobs, plugin)
    spec.kind, spec.plugin, spec.knob_names      # "rl", "coupled_grpo", ("t_min", "t_max", ...)
    catalogue.backbone("sdar").diffusion         # "block" (attention "block_causal")
    catalogue.task_names()                       # from the tasks registry

Algorithms. An RL algorithm with a plug-in is discovered from its torch-free settings module
`dare_bench/catalogue/knobs/<plugin>.py`, which defines the plug-in's `Config` (a subclass of
`AlgorithmConfig`, in `catalogue/settings.py`) and `ALGORITHM = AlgorithmSpec(name=..., kind="rl", knobs=<that
Config>)`; the plug-in itself is `dare_bench/trainers/algorithms/<plugin>.py`. The declarations sit here, on the
ground floor, because the reproduction schema (`config.py`) validates with them; the plug-ins need torch and sit
with the trainers. The knob schema the registry validates a reproduction with IS the plug-in's `Config`, so
what loads is what runs. Algorithms without a plug-in (evaluation only, SFT / LoRA, VRPO, and RL algorithms whose
plug-in does not exist yet) are declared below with their knob schemas.

Adding an RL algorithm `foo`: `dare_bench/catalogue/knobs/foo.py` (Config + ALGORITHM),
`dare_bench/trainers/algorithms/foo.py` (the plug-in), its test, `reproductions/_defaults/algorithms/foo.yaml` and the
reproduction YAMLs. Nothing else.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from dare_bench.catalogue.wsd import ArKnobs, CapKnobs, WsdCapKnobs, WsdKnobs
from dare_bench.errors import ConfigError

Kind = Literal["none", "sft", "rl", "preference", "wsd"]
Attention = Literal["bidirectional", "block_causal"]

# the torch-free Config + ALGORITHM of each RL plug-in, one module each, named after the plug-in
_CONFIG_PACKAGE = "dare_bench.catalogue.knobs"


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm: its reproduction name, which trainer runs it (`train.kind`), and its knob schema.

    `knobs` validates the algorithm's settings. For a plug-in it is the plug-in's `Config`, validated against the
    shared `train.*` fields and `train.algorithm` together (`catalogue.settings.algorithm_settings`);
    otherwise it validates `train.algorithm` alone. `plugin` is the plug-in module (and registered plug-in name)
    under `dare_bench.trainers.algorithms`, filled in by discovery; None when there is no plug-in.
    """

    name: str
    kind: Kind
    knobs: type[BaseModel]
    plugin: str | None = None
    # which diffusion kinds (BackboneSpec.diffusion) the algorithm applies to; a reproduction on another backbone
    # is refused at load time (config.profile_problem). RL plug-ins declare theirs as `attention_kinds`.
    diffusion: tuple[str, ...] = ("masked", "block")

    @property
    def takes_shared_settings(self) -> bool:
        """Whether the schema also covers the shared `train.*` fields (every RL plug-in's does)."""
        from dare_bench.catalogue.settings import AlgorithmConfig

        return issubclass(self.knobs, AlgorithmConfig)

    @property
    def knob_names(self) -> tuple[str, ...]:
        """What a reproduction may set under `train.algorithm` (the shared fields are set under `train.*`)."""
        from dare_bench.catalogue.settings import AlgorithmConfig

        shared = set(AlgorithmConfig.model_fields) if self.takes_shared_settings else set()
        names: list[str] = []
        for field_name, info in self.knobs.model_fields.items():
            if field_name in shared:
                continue
            names.append(field_name)
            alias = info.validation_alias
            if isinstance(alias, AliasChoices):
                names += [a for a in alias.choices if isinstance(a, str) and a != field_name]
        return tuple(names)

    def settings(self, train: Any) -> BaseModel:
        """This algorithm's typed settings from a `TrainSettings` (pydantic ValidationError when invalid)."""
        if self.takes_shared_settings:
            from dare_bench.catalogue.settings import algorithm_settings

            return self.knobs.model_validate(algorithm_settings(train))
        return self.knobs.model_validate(train.algorithm)

    def setting_path(self, field_name: str) -> str:
        """Where a reproduction sets the schema field `field_name`, relative to the scale (for error messages)."""
        if self.takes_shared_settings:
            from dare_bench.catalogue.settings import SHARED_TRAIN_FIELDS

            for train_name, plugin_name in SHARED_TRAIN_FIELDS.items():
                if plugin_name == field_name:
                    return f"train.{train_name}"
        return f"train.algorithm.{field_name}"


# ------------------------------------------------------------------------------ algorithms without a plug-in


class Knobs(BaseModel):
    """Knob schema of an algorithm without a plug-in: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class NoKnobs(Knobs):
    """Algorithms without knobs beyond the common train settings."""


class VrpoKnobs(Knobs):
    dpo_beta: float = Field(0.2, gt=0)  # read by the pipeline's VRPO trainer
    # the published recipe's data (paper scale); the pipeline builds only "task-pairs-from-base" and refuses others
    preference_data: str = "argilla/ultrafeedback-binarized-preferences-cleaned"


# An RL algorithm whose reproductions exist before its plug-in does is declared here with a `Knobs` schema (so the
# YAMLs stay typo-free; reproducing it fails in the plug-in lookup, "unknown algorithm"). None today.


_WITHOUT_PLUGIN = (
    AlgorithmSpec("baseline", "none", NoKnobs),
    # the released checkpoint under a harness' pinned evaluation protocol (DARE's OpenCompass table): evaluation
    # only, like baseline, but its own id, because the same model x benchmark is scored under two protocols (the
    # algorithm comparison's and the evaluation table's) and rows of the two must never meet
    AlgorithmSpec("released", "none", NoKnobs),
    AlgorithmSpec("sft", "sft", NoKnobs),
    AlgorithmSpec("lora", "sft", NoKnobs),
    AlgorithmSpec("vrpo", "preference", VrpoKnobs),
    # LLaDA2.0's own recipe (catalogue/wsd.py): the autoregressive start (next-token SFT of a block-size-1 replica,
    # decoded one token per forward), the block-level WSD conversion (its own trainer kind) and CAP (SFT + the
    # confidence loss). Block diffusion only: an MDLM has no block size to grow or shrink, and CAP's loss is the
    # authors' for their block-diffusion decoder.
    AlgorithmSpec("ar", "sft", ArKnobs, diffusion=("block",)),
    AlgorithmSpec("wsd", "wsd", WsdKnobs, diffusion=("block",)),
    AlgorithmSpec("wsd-cap", "wsd", WsdCapKnobs, diffusion=("block",)),
    AlgorithmSpec("cap", "sft", CapKnobs, diffusion=("block",)),
    # the four-arm comparison's from-scratch arm: block-diffusion SFT from random initialisation for the steps and
    # documents the AR start + the WSD conversion take (_defaults/algorithms/bdlm.yaml), so WSD is measured
    # against block diffusion trained directly at equal compute
    AlgorithmSpec("bdlm", "sft", NoKnobs, diffusion=("block",)),
)


@functools.cache
def algorithms() -> dict[str, AlgorithmSpec]:
    """Every algorithm by reproduction name: the declared ones above, then the plug-ins found on disk."""
    found = {spec.name: spec for spec in _WITHOUT_PLUGIN}
    package_dir = Path(__file__).resolve().parent / "knobs"
    for module in sorted(m.name for m in pkgutil.iter_modules([str(package_dir)])):
        spec = importlib.import_module(f"{_CONFIG_PACKAGE}.{module}").ALGORITHM
        if spec.name in found:
            raise ValueError(f"{module}.py declares algorithm {spec.name!r}, which is already declared")
        found[spec.name] = replace(spec, plugin=module)
    return found


def algorithm_names() -> tuple[str, ...]:
    return tuple(algorithms())


def find_algorithm(name: str) -> AlgorithmSpec | None:
    """The algorithm called `name` in a reproduction (`coupled-grpo`) or by its plug-in (`coupled_grpo`)."""
    specs = algorithms()
    if name in specs:
        return specs[name]
    return next((s for s in specs.values() if s.plugin is not None and s.plugin == name), None)


def algorithm(name: str) -> AlgorithmSpec:
    spec = find_algorithm(name)
    if spec is None:
        raise ConfigError(f"unknown algorithm {name!r}{_suggest(name, algorithm_names())}")
    return spec


def plugin_names() -> list[str]:
    return sorted(s.plugin for s in algorithms().values() if s.plugin is not None)


# --------------------------------------------------------------------------------------------------- backbones


@dataclass(frozen=True)
class BackboneSpec:
    """One backbone: `name` is the reproductions' backbone id, `family` its model family (`dare_bench.models`
    FAMILIES; the name itself for the four original backbones), `attention` the family's `ModelTraits.attention`
    (a test checks the two agree).

    A backbone that is a second released checkpoint of a family (SDAR-30B-A3B-Chat is an SDAR, LLaDA2.1-mini a
    LLaDA2) shares the family's model code and tiny replica; it has its own id because DARE's evaluation table
    scores it as its own column with its own pinned settings. `checkpoint` is the released weights it stands for.
    """

    name: str
    attention: Attention
    checkpoint: str
    family: str = ""

    def __post_init__(self):
        if not self.family:
            object.__setattr__(self, "family", self.name)

    @property
    def diffusion(self) -> Literal["masked", "block"]:
        """Masked diffusion (MDLM: bidirectional over the whole sequence) or block diffusion (BDLM)."""
        return "block" if self.attention == "block_causal" else "masked"

    @property
    def is_variant(self) -> bool:
        """A further checkpoint of another backbone's family (evaluation entries only: no tiny grid of its own)."""
        return self.family != self.name


BACKBONES = (
    BackboneSpec("llada", "bidirectional", "GSAI-ML/LLaDA-8B-Instruct"),
    BackboneSpec("dream", "bidirectional", "Dream-org/Dream-v0-Instruct-7B"),
    BackboneSpec("sdar", "block_causal", "JetLM/SDAR-8B-Chat"),
    BackboneSpec("llada2", "block_causal", "inclusionAI/LLaDA2.0-mini"),
    BackboneSpec("sdar30b", "block_causal", "JetLM/SDAR-30B-A3B-Chat", family="sdar"),
    BackboneSpec("llada2.1", "block_causal", "inclusionAI/LLaDA2.1-mini", family="llada2"),
)


def backbone_names() -> tuple[str, ...]:
    return tuple(b.name for b in BACKBONES)


def backbone(name: str) -> BackboneSpec:
    for spec in BACKBONES:
        if spec.name == name:
            return spec
    raise ConfigError(f"unknown backbone {name!r}{_suggest(name, backbone_names())}")


# ------------------------------------------------------------------------------------------------------- tasks


def task_names() -> tuple[str, ...]:
    """The tasks registry's names (`dare_bench.tasks`, torch-free)."""
    from dare_bench.tasks import list_tasks

    return tuple(list_tasks())


def _suggest(word: str, options: tuple[str, ...]) -> str:
    hits = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f"; did you mean {hits[0]!r}?" if hits else f" (known: {', '.join(options)})"


__all__ = ["AlgorithmSpec", "BACKBONES", "BackboneSpec", "Knobs", "algorithm", "algorithm_names", "algorithms",
           "backbone", "backbone_names", "find_algorithm", "plugin_names", "task_names"]
