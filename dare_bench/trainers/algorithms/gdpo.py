"""GDPO — Group Diffusion Policy Optimization (Rojas, Lin, Rasul, Schneider, Nevmyvaka, Tao, Deng; arXiv 2510.08554,
ICLR 2026): GRPO for masked diffusion LMs on the sequence ELBO, estimated by semi-deterministic Monte Carlo.

Sources read. The authors' code, KevinRojas1499/GDPO @ 1918683 (the repository's HEAD when fetched; it is the
paper's code link in the README of the NeMo RL port below): `gdpo/likelihood_estimators.py`
(`NumericalIntegrationEstimator`: `quadratures`, `forward_process`, `get_log_likelihood`, `get_loss`),
`gdpo/gdpo_trainer.py` (`GDPOTrainer.compute_loss`; `_process_completions`: mask seeds; `_compute_seq_logps`: old
and reference ELBOs; `_compute_rewards_and_advantages`), `gdpo/gdpo_config.py` (knobs and defaults),
`gdpo/slurm_scripts/{train.yaml,countdown_base.sbatch}` (the recipe). Cross-checked against the port written with
a co-author (NVIDIA-NeMo/RL pull request #3550, `research/gdpo/`: `gdpo/elbo.py`, `configs/gdpo_llada_8b.yaml`,
`README.md`), which agrees on every point below. The paper's text beyond its abstract could not be read here, so
no equation numbers are cited: everything below is what the official code computes. Fixture:
`tests/fixtures/losses/gdpo/` (the official estimator and `compute_loss` run unmodified on a toy model), checked by
`tests/trainers/test_gdpo.py`.

Likelihood. The whole completion y is one action; log π(y | c) is replaced by the masked-diffusion ELBO
    E(y) = ∫_0^1 (1/t) E_{y_t ~ q_t} [ Σ_{i masked in y_t} log p_θ(y_i | y_t, c) ] dt,
and the time integral is done by a fixed Gauss-Legendre rule (knob `quadrature`, official `logp_estimator`;
the recipe's gauss-3): nodes x_q, weights w_q on [-1, 1], mapped to t_q = (x_q + 1)/2 and w_q / 2 on [0, 1]; only
the masks stay random, K per node (`mc_samples`, official `mc_batch_size`: 1). This is the "semi-deterministic"
estimator (SDMC): the variance of the time dimension is traded for a deterministic quadrature error (none for an
integrand polynomial in t of degree < 2N).
    Ê(y) = Σ_q (w_q / 2) (1/K) Σ_k (1/t_q) Σ_{i ∈ m_qk} log p_θ(y_i | y ⊙ m_qk, c)
Mask m_qk (`masking.fixed_ratio_masks`): exactly int(t_q · L) of the L scored completion positions, uniformly
(upstream's `randperm(L)[:int(t L)]`), weight 1/t_q (not L / count). The truncation biases short completions:
with context-free log-probs the mean is Σ_q w_q int(t_q L) / (t_q L) of the ELBO, 0.8 % short for gauss-3 at the
recipe's L = 256, 7.6 % at the tiny scale's 24 (`test_consistent_as_the_completion_grows`); kept, as upstream
(the ratio compares θ and θ_old on the same masks). Upstream's L is the whole completion canvas
(`logits_to_keep`, post-EOS tokens included; knob `elbo_span: canvas`, the default); `elbo_span: completion`
scores only the tokens up to and including the first EOS and treats the rest as padding, as the other ELBO
plug-ins do. The prompt is never masked (`p_mask_prompt` of the official config is not read by this estimator).
Nodes x, in the official order (which fixes the RNG order): gauss-1 (0); gauss-2 (−1/√3, 1/√3); gauss-3 (−√(3/5),
0, √(3/5)); gauss-4 (−a, a, −b, b), a < b the inner / outer roots; gauss-5 (0, −a, a, −b, b). Upstream's
'simpson' mode cannot be built by its class (KeyError) and 'mc' / 'd1' are other estimators (LLaDA's stratified MC,
d1's one step): not offered.

Masks per update iteration (`_process_completions`, `compute_loss`): seeds s_k ~ U{0..4095} for the μ iterations
(`random_masking`; else 42 for every k); iteration k's masks come from a generator seeded s_k, consumed as the
official `torch.manual_seed(s_k)` then node-major, row-major, copy-minor `randperm`s, so a seed reproduces the
official masks of the same batch. They are drawn here for the whole rollout batch in `prepare` and shared by
θ, θ_old and the reference. (Upstream draws them per micro-batch, and computes θ_old's ELBOs of all μ iterations in
one call under one seed on a μ-times repeated batch, so beyond the first node they are not θ's masks; the port
above requires shared masks — its `mask_points` docstring — and so does this plug-in.)

Loss (`compute_loss`), per sequence, with R = the padded completion length (`completion_ids.shape[-1]`):
    ρ = exp((Ê − Ê_old) / R)            one length-normalised ratio per sequence
    ℓ = −min(ρ A, clip(ρ, 1 − ε, 1 + ε) A) + β · KL,  KL = exp(Ê_ref − Ê) − (Ê_ref − Ê) − 1 (k3 on RAW ELBOs)
    loss = mean over the rows (`loss.mean()`)
The recipe: ε = 0.5, β = 0 (no reference), μ = 12. `clip_eps_high` (asymmetric), `clip_ratio_c` (verl's cap
−A·c for A < 0, off by default: upstream has none) and `kl_estimator` (k1 / abs / k2 / k3 on the raw difference,
unclamped; default k3 = upstream) are the shared settings. μ = 1 or iteration 0: Ê_old = Ê (upstream's
`logps.detach()`; at iteration 0 θ is θ_old), so `prepare` computes Ê_old for iterations 1..μ−1 only.
Advantages (`_compute_rewards_and_advantages`): A = r − mean_group(r), no std division (Dr. GRPO; `advantage:
mean`, the default here); `mean_std` and `leave_one_out` are accepted.

Backward (memory O(1) in the N·K copies, like ESPO's): Ê is evaluated without a graph, g = ∂(loss · scale)/∂Ê is
taken on a detached copy, then each copy's term is recomputed with a graph and (g · w_q / (2K) · term).sum()
back-propagated: the gradient is that of the loss (upstream keeps all N·K forwards in one graph); with dropout
(LoRA dropout at paper scale) the two passes see different dropout masks, as in ESPO.

One deliberate difference from upstream, as in the d1 / wd1 plug-ins: the model gets the batch's padding mask, so
left-padded prompts do not attend to pad tokens (upstream calls the model without one).

Backbones: `attention_kinds = ("bidirectional",)` — LLaDA (the authors' only backbone) and Dream (the logit shift is
the likelihood module's). A block-diffusion backbone has a per-block ELBO, not this one.

Knobs (`train.algorithm`, `dare_bench/catalogue/knobs/gdpo.py`): quadrature, random_masking, elbo_span; shared
settings (`train.*`): mc_samples (masks per node), clip_eps, clip_eps_high, clip_ratio_c, beta_kl, kl_estimator,
advantage. `loss_agg` is not used.
"""

from __future__ import annotations

import math

import torch

from dare_bench.catalogue.knobs.gdpo import GDPOConfig
from dare_bench.errors import ConfigError
from dare_bench.trainers.algorithms.base import Algorithm, AlgorithmState, RolloutBatch, register_algorithm
from dare_bench.trainers.algorithms.bgpo import elbo_layout, per_iteration_no_grad, with_traits
from dare_bench.trainers.algorithms.common import (
    group_advantages,
    iteration_mask_seeds,
    kl_estimate,
    proxy_gradient,
    with_kl_term,
)
from dare_bench.trainers.algorithms.espo import espo_policy_loss

# --- the time quadrature ------------------------------------------------------------------------------------------

def _gauss_legendre_nodes(rule: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Gauss-Legendre nodes and weights on [-1, 1] (closed forms), in the official code's order."""
    if rule == "gauss-1":
        return (0.0,), (2.0,)
    if rule == "gauss-2":
        r = 1 / math.sqrt(3)
        return (-r, r), (1.0, 1.0)
    if rule == "gauss-3":
        r = math.sqrt(3 / 5)
        return (-r, 0.0, r), (5 / 9, 8 / 9, 5 / 9)
    if rule == "gauss-4":
        inner, outer = math.sqrt(3 / 7 - 2 / 7 * math.sqrt(6 / 5)), math.sqrt(3 / 7 + 2 / 7 * math.sqrt(6 / 5))
        w_in, w_out = (18 + math.sqrt(30)) / 36, (18 - math.sqrt(30)) / 36
        return (-inner, inner, -outer, outer), (w_in, w_in, w_out, w_out)
    if rule == "gauss-5":
        inner = math.sqrt(5 - 2 * math.sqrt(10 / 7)) / 3
        outer = math.sqrt(5 + 2 * math.sqrt(10 / 7)) / 3
        w_in, w_out = (322 + 13 * math.sqrt(70)) / 900, (322 - 13 * math.sqrt(70)) / 900
        return (0.0, -inner, inner, -outer, outer), (128 / 225, w_in, w_in, w_out, w_out)
    raise ConfigError(f"unknown GDPO quadrature {rule!r}; expected gauss-1 .. gauss-5")


def quadrature(rule: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(times, weights) of `rule` on [0, 1]: t = (x + 1) / 2, w / 2, so Σ_q w_q f(t_q) ≈ ∫_0^1 f(t) dt (the
    weights sum to 1); exact for polynomials of degree < 2N."""
    nodes, weights = _gauss_legendre_nodes(rule)
    return tuple(0.5 * x + 0.5 for x in nodes), tuple(0.5 * w for w in weights)


# --- the plug-in -------------------------------------------------------------------------------------------------

@register_algorithm
class GDPO(Algorithm):
    name = "gdpo"
    Config = GDPOConfig
    attention_kinds = ("bidirectional",)  # the MDLM ELBO over the whole completion: LLaDA (authors), Dream

    def validate(self) -> None:
        c = self.config
        if c.advantage not in (None, "mean", "mean_std", "leave_one_out"):
            raise ConfigError(f"gdpo: unknown advantage {c.advantage!r}")
        if not 0 <= c.clip_eps < 1:
            raise ConfigError(f"gdpo: need 0 <= clip_eps < 1, got {c.clip_eps}")
        self.times, self.weights = quadrature(c.quadrature)

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.config.advantage or "mean")

    # --- estimator ------------------------------------------------------------------------------------------------
    @property
    def copies_per_iteration(self) -> int:
        return len(self.times) * self.config.mc_samples

    def layout(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(input ids, attention mask, P): the whole canvas attended and scored, or (`elbo_span: completion`) the
        completion up to its first EOS, later positions as padding."""
        if self.config.elbo_span == "completion":
            return elbo_layout(batch)
        return batch.input_ids, batch.attention_mask, int(batch.prompt_ids.shape[1])

    def draw(self, batch: RolloutBatch, seed: int):
        """One update iteration's masks: `fixed_ratio_masks` at the quadrature times from a generator seeded `seed`."""
        from dare_bench.diffusion.masking import fixed_ratio_masks

        _, attn, p = self.layout(batch)
        return fixed_ratio_masks(attn.cpu(), p, generator=torch.Generator().manual_seed(int(seed)),
                                 ratios=self.times, n=self.config.mc_samples)

    def _draw(self, batch: RolloutBatch, rows: dict[str, torch.Tensor]):
        from dare_bench.diffusion.masking import MaskDraw, prompt_response_masks

        _, attn, p = self.layout(batch)
        _, response = prompt_response_masks(attn, p)
        return MaskDraw(mask=rows["mask"], p_mask=rows["p_mask"], response_mask=response, scheme="fixed_ratio")

    def copies(self, iteration: int, available: int) -> range:
        n = self.copies_per_iteration
        if (iteration + 1) * n > available:
            raise ConfigError(f"gdpo: update iteration {iteration} has no masks (prepare drew {available // n} "
                              "iterations; num_iterations must cover every update)")
        return range(iteration * n, (iteration + 1) * n)

    def coefficient(self, copy: int) -> float:
        """w_q / K of a copy (copy = it·N·K + q·K + k): its weight in the sequence ELBO."""
        K = self.config.mc_samples
        return self.weights[(copy // K) % len(self.times)] / K

    def term(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor], copy: int) -> torch.Tensor:
        """`[n]`: (1/t_q) Σ_{masked} log p(y_i | masked copy), one forward."""
        from dare_bench.diffusion.likelihood import elbo_term

        ids, attn, _ = self.layout(batch)
        return elbo_term(model, ids, self._draw(batch, rows), copy, attention_mask=attn,
                         head_chunk_tokens=self.config.lm_head_chunk_tokens).total

    def sequence_elbo(self, model, batch: RolloutBatch, rows: dict[str, torch.Tensor], iteration: int) -> torch.Tensor:
        """Ê `[n]` of one update iteration: Σ over its copies of (w_q / K) · term (the raw sequence ELBO)."""
        total = None
        for c in self.copies(iteration, rows["mask"].shape[1]):
            part = self.coefficient(c) * self.term(model, batch, rows, c)
            total = part if total is None else total + part
        return total

    @torch.no_grad()
    def prepare(self, batch: RolloutBatch, policy, reference, *, generator: torch.Generator,
                num_iterations: int) -> AlgorithmState:
        I = max(int(num_iterations), 1)
        seeds = iteration_mask_seeds(generator, I, self.config.random_masking)
        draws = [self.draw(batch, s) for s in seeds]
        device = batch.prompt_ids.device
        mask = torch.cat([d.mask for d in draws], dim=1).to(device)  # [N, I·Q·K, L], iteration-major
        p_mask = torch.cat([d.p_mask for d in draws], dim=1).to(device)
        rows = {"mask": mask, "p_mask": p_mask}

        def per_iteration(model, first: int):
            return per_iteration_no_grad(lambda b, r, it: self.sequence_elbo(model, b, r, it), batch, rows, I,
                                         first, self.forward_batch_size)

        if I > 1:  # iteration 0 runs at θ = θ_old: its Ê_old is the Ê of the update's own no-grad pass
            rows["old"] = per_iteration(policy, 1)
        if self.config.kl_beta > 0:
            if reference is None:
                raise ConfigError("gdpo with kl_beta > 0 needs a reference model")
            rows["ref"] = per_iteration(with_traits(reference, self.traits), 0)
        return AlgorithmState(rows=rows, shared={"mask_seeds": seeds})

    # --- loss -----------------------------------------------------------------------------------------------------
    def objective(self, E: torch.Tensor, E_old: torch.Tensor, E_ref: torch.Tensor | None, advantages: torch.Tensor,
                  R: int):
        """(loss, metrics, kl) of raw sequence ELBOs `[n]`: the clipped sequence ratio exp((Ê − Ê_old) / R) and
        β · KL on the raw ELBOs, both means over the rows."""
        c = self.config
        col = lambda v: v.to(E.dtype)[:, None]  # noqa: E731  (one "token" per row: the sequence)
        terms = espo_policy_loss(col(E_old / R), col(E / R), col(advantages), torch.ones_like(col(E)),
                                 clip_low=c.clip_eps, clip_high=c.clip_eps_high, clip_ratio_c=c.clip_ratio_c)
        kl = None if E_ref is None else kl_estimate(E, E_ref.to(E.dtype), c.kl_estimator, clamp=None).mean()
        return with_kl_term(terms, kl, c.kl_beta)

    def backward(self, policy, batch: RolloutBatch, state: AlgorithmState, advantages: torch.Tensor, *,
                 loss_scale: float, iteration: int) -> dict[str, float]:
        rows = state.rows
        R = batch.completion_ids.shape[1]
        copies = self.copies(iteration, rows["mask"].shape[1])
        with torch.no_grad():
            E_now = self.sequence_elbo(policy, batch, rows, iteration)
        E_old = rows["old"][:, iteration] if ("old" in rows and iteration > 0) else E_now.clone()
        E_ref = rows["ref"][:, iteration] if "ref" in rows else None
        loss, metrics, kl, g = proxy_gradient(self.objective, E_now, E_old, E_ref, advantages, R,
                                              loss_scale=loss_scale)
        for c in copies:  # ∂loss/∂θ = Σ_n g_n Σ_c coef_c ∂term_nc/∂θ, one copy's graph at a time
            if not bool(rows["mask"][:, c].any()):  # nothing masked in this micro-batch at this node
                continue
            term = self.term(policy, batch, rows, c)
            ((term * g.to(term.dtype)).sum() * self.coefficient(c)).backward()
        metrics["loss"] = float(loss.detach())
        if kl is not None:
            metrics["kl"] = float(kl.detach())
        metrics["elbo"] = float((E_now / R).mean())
        metrics["ratio"] = float(torch.exp((E_now - E_old.to(E_now.dtype)) / R).mean())
        metrics["mc_samples"] = float(self.config.mc_samples)
        metrics["elbo_forwards"] = float(self.copies_per_iteration)
        metrics["scored_tokens"] = float(self._draw(batch, rows).response_mask.sum())
        return metrics
