"""Diffusion core: forward-process mask samplers (`masking`), likelihood / ELBO estimators (`likelihood`),
samplers (`sampling`) and KV caches (`cache`).

Import the submodule you need (`from dare_bench.diffusion.masking import stratified_masks`); this package imports
nothing eagerly so that importing one part never pulls in the others.
"""
