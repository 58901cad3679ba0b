"""Knobs cannot drift between the loader and the plug-ins, in either direction.

Loader -> plug-in: the registry validates a reproduction with the catalogue's schema, which must be the plug-in's
own `Config`, and every field of it must be settable from a reproduction (its own fields under `train.algorithm`,
the shared ones under `train.*`). Plug-in -> loader: a run through the loop with a config object that records
which fields the plug-in reads must see every field read, except the shared ones the plug-in declares unused
(and those must really be unused, so the declaration cannot go stale).
"""

import pytest

from dare_bench import catalogue
from dare_bench.catalogue.settings import SHARED_TRAIN_FIELDS, AlgorithmConfig
from dare_bench.trainers.algorithms import get_algorithm
from dare_bench.trainers.loop import RLRunOptions, train_rl

from rl_fakes import CharTokenizer, ReverseTask, micro_llada, micro_sdar, rl_settings

PLUGINS = [spec.name for spec in catalogue.algorithms().values() if spec.plugin is not None]


class ReadTracker:
    """Wraps a plug-in config and records every schema field read through it."""

    def __init__(self, config, seen: set[str]):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name):
        config = object.__getattribute__(self, "_config")
        if name in type(config).model_fields:
            object.__getattribute__(self, "_seen").add(name)
        return getattr(config, name)


@pytest.mark.parametrize("name", PLUGINS)
def test_the_loader_validates_with_the_plugins_own_config(name):
    spec = catalogue.algorithm(name)
    cls = get_algorithm(name)
    assert spec.knobs is cls.Config and issubclass(cls.Config, AlgorithmConfig)
    assert cls.name == spec.plugin
    settable = set(spec.knob_names) | set(SHARED_TRAIN_FIELDS.values())
    assert set(cls.Config.model_fields) <= settable
    assert set(SHARED_TRAIN_FIELDS.values()) == set(AlgorithmConfig.model_fields)
    assert cls.Config.unused_shared_settings <= set(AlgorithmConfig.model_fields)


@pytest.mark.parametrize("name", PLUGINS)
def test_the_plugin_reads_every_setting_the_loader_accepts(name, monkeypatch):
    spec = catalogue.algorithm(name)
    cls = get_algorithm(name)
    seen: set[str] = set()
    config_cls = cls.Config
    monkeypatch.setattr(cls, "Config", staticmethod(lambda **kw: ReadTracker(config_cls(**kw), seen)))
    many_samples = "mc_samples" in config_cls.model_fields and config_cls.model_fields["mc_samples"].default > 1
    # with and without a KL term (SPG, wd1 and TraceRL refuse one): the reference branches read their settings
    no_kl = ("spg", "wd1", "tracerl")
    for beta_kl in (0.0, 0.05) if name not in no_kl else (0.0,):
        model = micro_llada(0) if "bidirectional" in cls.attention_kinds else micro_sdar(0)
        knobs = {"spg": {"mask_block_length": 2}}.get(name, {})  # 4-token completions: 2 mask blocks
        train_rl(model, CharTokenizer(), ReverseTask(), name,
                 rl_settings(steps=2, mu=2, beta_kl=beta_kl, mc_samples=2 if many_samples else None, algorithm=knobs),
                 options=RLRunOptions(progress=False, micro_batch_size=8))
    unread = set(config_cls.model_fields) - seen
    assert unread == set(config_cls.unused_shared_settings), (
        f"{spec.name}: the loader accepts {sorted(unread - config_cls.unused_shared_settings)} but the plug-in never "
        f"reads them; it reads {sorted(seen & config_cls.unused_shared_settings)}, declared unused")
