"""Invariants of the mask samplers (algorithms.md §1.1, §3, §4, §5, §8, §10.4) and RNG-exact reproduction of the
official DARE forward processes whose masks are stored in the loss fixtures."""

import json
import random

import pytest
import torch

from dare_bench.diffusion.masking import (
    MaskDraw,
    coupled_masks,
    d1_masks,
    ebpo_block_index,
    ebpo_block_masks,
    ebpo_mask_count,
    espo_batch_masks,
    espo_mask_counts,
    espo_masks,
    fixed_ratio_masks,
    iid_masks,
    prompt_response_masks,
    spg_block_masks,
    stratified_mask_counts,
    stratified_masks,
)
from dare_bench.errors import ConfigError, DareBenchError, DataError

from testpaths import LOSSES

MASK = 99


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def layout(B=3, P=4, R=8, prompt_pads=(0, 1, 2), response_lens=(8, 5, 1)):
    """DARE layout: left-padded prompt in [:P], right-padded response in [P:]."""
    am = torch.zeros(B, P + R, dtype=torch.long)
    for b in range(B):
        am[b, prompt_pads[b]:P] = 1
        am[b, P:P + response_lens[b]] = 1
    ids = torch.randint(0, 50, (B, P + R), generator=gen(123))
    return am, ids


def _load(folder):
    st = LOSSES / folder / "cases.safetensors"
    from safetensors.torch import load_file

    return load_file(str(st)), json.loads((LOSSES / folder / "cases.json").read_text())


# --- official RNG reproduction ------------------------------------------------------------------------------------

def test_coupled_masks_reproduce_official_fixture():
    T, _ = _load("coupled_d1_logprob")
    am = T["coupled_grpo/in/attention_mask"]
    for b in range(am.shape[0]):
        # fixture: set_seed(42 + b) per sample; t from Python's random, U from torch's CPU generator
        t = random.Random(42 + b).uniform(0.2, 0.8)
        d = coupled_masks(am[b:b + 1], 4, generator=gen(42 + b), t=t)
        assert torch.equal(d.mask[0], T["coupled_grpo/in/mask_indices"][b])
        assert torch.equal(d.p_mask[0].double(), T["coupled_grpo/in/p_mask"][b])
        noisy = d.noisy_ids(T["coupled_grpo/in/input_ids"][b:b + 1], 7)
        assert torch.equal(noisy[0], T["coupled_grpo/in/perturbed_seq"][b])


def test_d1_masks_reproduce_official_fixture():
    T, _ = _load("coupled_d1_logprob")
    d = d1_masks(T["d1/in/attention_mask"], 4, generator=gen(7))
    assert torch.equal(d.mask, T["d1/in/mask_indices"])
    assert torch.equal(d.p_mask.double(), T["d1/in/p_mask"])
    assert torch.equal(d.noisy_ids(T["d1/in/input_ids"], 7), T["d1/in/perturbed_seq"])


def test_spg_masks_reproduce_official_fixture():
    T, J = _load("spg")
    for case in J["cases"]:
        if not case["name"].startswith("est_"):
            continue
        k = case["name"] + "/in/"
        am = T[k + "attention_mask"]
        for b in range(am.shape[0]):
            d = spg_block_masks(am[b:b + 1], 4, generator=gen(500 + b), block_length=4, n=2)
            assert torch.equal(d.mask[0], T[k + "mask_indices"][b, 0])
            assert torch.equal(d.p_mask[0].double(), T[k + "p_mask"][b, 0])
            assert torch.equal(d.noisy_ids(T[k + "input_ids"][b:b + 1], 8)[0], T[k + "perturbed_seq"][b, 0])


def test_espo_masks_reproduce_official_fixture():
    T, _ = _load("espo")
    am = torch.zeros(1, 14, dtype=torch.long)
    am[0, :12] = 1  # prompt 4, response 8 valid of 10 (fixture description)
    d = espo_masks(am, 4, generator=gen(11), n=4)
    for r in range(4):
        k = f"seq_elbo_row{r}_reduce_var_True/in/"
        assert torch.equal(d.mask[0, r], T[k + "mask_indices"])
        assert torch.equal(d.p_mask[0, r], T[k + "p_mask"])
        assert torch.equal(d.response_mask[0], T[k + "valid_response_mask"])


def test_espo_batch_masks_reproduce_official_fixture():
    """DARE's worker calls `_forward_process_espo` on the whole batch: the fixture's draw (seed 11) is a batch of
    4 rows with equal completion lengths (8 valid of 10), i.e. the row-stratified branch, = espo_masks(n=4)."""
    T, _ = _load("espo")
    am = torch.zeros(4, 14, dtype=torch.long)
    am[:, :12] = 1
    d = espo_batch_masks(am, 4, generator=gen(11), n=1)
    one = espo_masks(am[:1], 4, generator=gen(11), n=4)
    for r in range(4):
        k = f"seq_elbo_row{r}_reduce_var_True/in/"
        assert torch.equal(d.mask[r, 0], T[k + "mask_indices"])
        assert torch.equal(d.p_mask[r, 0], T[k + "p_mask"])
        assert torch.equal(d.mask[r, 0], one.mask[0, r]) and torch.equal(d.p_complement[r, 0], one.p_complement[0, r])


def _dare_espo_unequal(am, prompt_len, g):
    """The independent branch of DARE's `_forward_process_espo`, written out: every row's k first, then a
    randperm for each row with k > 0 (the order in which it consumes the RNG)."""
    _, response = prompt_response_masks(am, prompt_len)
    lens = response.sum(dim=1).tolist()
    ks = [int(torch.randint(0, t + 1, (), generator=g)) if t > 0 else 0 for t in lens]
    mask = torch.zeros(am.shape, dtype=torch.bool)
    for i, (t, k) in enumerate(zip(lens, ks)):
        if t > 0 and k > 0:
            idx = torch.nonzero(response[i]).flatten()
            mask[i, idx[torch.randperm(t, generator=g)[:k]]] = True
    p = torch.tensor([k / (t + 1) if t else 0.0 for t, k in zip(lens, ks)], dtype=torch.float32)
    return mask, p


def test_espo_batch_masks_branches():
    am, _ = layout()  # completion lengths 8, 5, 1: one independent level per row, as DARE
    g_ref, g = gen(5), gen(5)
    d = espo_batch_masks(am, 4, generator=g, n=2)
    for c in range(2):
        mask, p = _dare_espo_unequal(am, 4, g_ref)
        assert torch.equal(d.mask[:, c], mask)
        torch.testing.assert_close(d.p_mask[:, c, 0], p, rtol=0, atol=0)
    L = d.response_mask.sum(-1, keepdim=True).float()
    assert torch.allclose(d.p_complement[:, :, 0], L / (L + 1) - d.p_mask[:, :, 0])
    assert torch.equal(d.complement().loss_mask | d.loss_mask, d.response_mask[:, None].expand_as(d.mask))
    # equal lengths: the L+1 levels are spread over the rows (b = L+1 rows: every level once, 0 and L included)
    eq = torch.zeros(6, 9, dtype=torch.long)
    eq[:, :9] = 1  # prompt 4, completion 5 valid
    for seed in range(4):
        s = espo_batch_masks(eq, 4, generator=gen(seed), n=1)
        assert sorted(s.mask[:, 0].sum(-1).tolist()) == [0, 1, 2, 3, 4, 5]
        free = espo_batch_masks(eq, 4, generator=gen(seed), n=1, stratify_rows=False)
        assert torch.equal(free.mask, _dare_espo_unequal(eq, 4, gen(seed))[0][:, None])
    empty = espo_batch_masks(torch.ones(2, 4, dtype=torch.long), 4, generator=gen(), n=2)
    assert not empty.mask.any() and not empty.p_mask.any()


# --- determinism, shapes, errors ----------------------------------------------------------------------------------

SAMPLERS = {
    "iid": lambda am, g: iid_masks(am, 4, generator=g, n=3),
    "stratified": lambda am, g: stratified_masks(am, 4, generator=g, n=4, repeats=2),
    "coupled": lambda am, g: coupled_masks(am, 4, generator=g),
    "d1": lambda am, g: d1_masks(am, 4, generator=g),
    "spg": lambda am, g: spg_block_masks(am, 4, generator=g, block_length=4, n=2),
    "ebpo": lambda am, g: ebpo_block_masks(am, 4, generator=g, block_length=3, n=2, repeats=2),
    "espo": lambda am, g: espo_masks(am, 4, generator=g, n=3),
    "espo_batch": lambda am, g: espo_batch_masks(am, 4, generator=g, n=3),
    "fixed_ratio": lambda am, g: fixed_ratio_masks(am, 4, generator=g, ratios=(0.3, 0.9), n=2),
}
COPIES = {"iid": 3, "stratified": 8, "coupled": 3, "d1": 1, "spg": 2, "ebpo": 4, "espo": 3, "espo_batch": 3,
          "fixed_ratio": 4}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_seeded_determinism_and_shapes(name):
    am, ids = layout()
    a, b, c = SAMPLERS[name](am, gen(1)), SAMPLERS[name](am, gen(1)), SAMPLERS[name](am, gen(2))
    B, L = am.shape
    assert a.mask.shape == a.p_mask.shape == (B, COPIES[name], L) and a.n == COPIES[name]
    assert a.mask.dtype == torch.bool and a.response_mask.shape == (B, L)
    assert torch.equal(a.mask, b.mask) and torch.equal(a.p_mask, b.p_mask)
    assert not (torch.equal(a.mask, c.mask) and torch.equal(a.p_mask, c.p_mask))
    noisy = a.noisy_ids(ids, MASK)
    assert torch.equal(a.mask, noisy == MASK)  # DARE asserts this after every forward process
    # every scored position is a masked valid completion token, and each scored p is a probability
    assert torch.equal(a.loss_mask, a.mask & a.response_mask[:, None])
    p = a.p_mask[a.loss_mask]
    assert bool(((p > 0) & (p <= 1)).all())
    one = a.select(a.n - 1)
    assert one.n == 1 and torch.equal(one.mask[:, 0], a.mask[:, -1])


@pytest.mark.parametrize("name", ["iid", "stratified", "ebpo", "espo", "espo_batch", "fixed_ratio"])
def test_prompt_and_padding_never_masked(name):
    am, _ = layout()
    d = SAMPLERS[name](am, gen(3))
    _, response = prompt_response_masks(am, 4)
    assert not bool((d.mask & ~response[:, None]).any())


def test_samplers_refuse_missing_generator_and_bad_input():
    am, _ = layout()
    with pytest.raises(ConfigError):
        stratified_masks(am, 4, generator=None, n=2)
    with pytest.raises(ConfigError):
        coupled_masks(am, 4, generator=gen(), t=1.5)
    with pytest.raises(ConfigError):
        spg_block_masks(am, 4, generator=gen(), block_length=3)  # 8 not a multiple of 3
    with pytest.raises(ConfigError):
        spg_block_masks(am, 4, generator=gen(), block_length=4, n=3)  # only 2 blocks
    with pytest.raises(DataError):
        stratified_masks(torch.ones(2, 3, 4), 4, generator=gen(), n=2)
    empty = am.clone()
    empty[0, 4:] = 0
    with pytest.raises(DataError):
        stratified_masks(empty, 4, generator=gen(), n=2)
    with pytest.raises(ConfigError):
        iid_masks(am, 4, generator=gen(), n=0)
    assert issubclass(ConfigError, DareBenchError)


# --- scheme-specific invariants -------------------------------------------------------------------------------------

def test_iid_masks_rate_and_probabilities():
    am = torch.ones(256, 40, dtype=torch.long)
    t = torch.full((256, 2), 0.3)
    d = iid_masks(am, 8, generator=gen(4), n=2, t=t, eps=1e-3)
    assert torch.equal(iid_masks(am, 8, generator=gen(4), n=2, t=0.3, eps=1e-3).mask, d.mask)
    with pytest.raises(ConfigError):
        iid_masks(am, 8, generator=gen(4), n=2, t=1.5)
    p = (1 - 1e-3) * 0.3 + 1e-3
    assert torch.allclose(d.p_mask, torch.full_like(d.p_mask, p))
    assert not bool(d.mask[:, :, :8].any())
    rate = d.mask[:, :, 8:].float().mean().item()
    assert abs(rate - p) < 0.015  # 16384 Bernoulli draws: sd ~ 0.0036
    drawn = iid_masks(am, 8, generator=gen(5), n=2)
    assert bool(((drawn.t >= 0) & (drawn.t < 1)).all())
    assert torch.allclose(drawn.p_mask[:, :, 0], (1 - 1e-3) * drawn.t + 1e-3)


def test_stratified_counts_cover_each_stratum_once():
    for L in (1, 3, 7, 10):
        for k in range(1, L + 1):
            x = stratified_mask_counts(k, L, L)
            assert sorted(x.tolist()) == list(range(1, L + 1))  # n = L: a permutation of 1..L
    am, _ = layout()
    d = stratified_masks(am, 4, generator=gen(6), n=5, repeats=2)
    counts = d.loss_mask.sum(-1)
    L_valid = d.response_mask.sum(-1, keepdim=True)
    assert bool(((counts >= 1) & (counts <= L_valid)).all())  # >= 1 masked token per copy, at most L
    assert torch.allclose(d.p_mask[:, :, 0], counts.to(d.p_mask.dtype) / L_valid)
    # each row of 5 copies is one stratified set: counts(k) for the drawn k
    for b in range(am.shape[0]):
        Lb = int(L_valid[b])
        for r in range(2):
            got = counts[b, 5 * r:5 * r + 5].tolist()
            assert any(stratified_mask_counts(k, Lb, 5).tolist() == got for k in range(1, Lb + 1))


def test_stratified_counts_marginal_uniformity_and_round_half_even_tie():
    # x_j(k) is uniform over 1..L when j L / n is never a half-integer ...
    for L, n in ((4, 2), (6, 3), (5, 3), (8, 4), (16, 16)):
        for j in range(n):
            col = sorted(stratified_mask_counts(k, L, n)[j].item() for k in range(1, L + 1))
            assert col == list(range(1, L + 1))
    # ... but torch.round's half-to-even makes it non-uniform otherwise (official quirk, kept: see test_likelihood)
    col = sorted(stratified_mask_counts(k, 4, 8)[1].item() for k in range(1, 5))
    assert col == [2, 2, 4, 4]


def test_coupled_masks_partition_the_completion():
    am, _ = layout()
    d = coupled_masks(am, 4, generator=gen(8))
    prompt, response = prompt_response_masks(am, 4)
    lm = d.loss_mask
    assert torch.equal(lm[:, 0], response)  # copy 0: whole completion
    assert not bool((lm[:, 1] & lm[:, 2]).any())  # copies 1-2 disjoint ...
    assert torch.equal(lm[:, 1] | lm[:, 2], response)  # ... and cover the completion
    assert not bool((d.mask & prompt[:, None]).any())  # valid prompt never masked
    t = d.t[:, 1]
    assert bool(((t >= 0.2) & (t <= 0.8)).all())
    assert torch.allclose(d.t[:, 2], 1 - t)
    for c, want in ((0, torch.ones_like(t)), (1, t), (2, 1 - t)):
        got = torch.where(lm[:, c], d.p_mask[:, c], torch.nan)
        some = lm[:, c].any(dim=1)  # the 1-token row may leave copy 1 or 2 empty
        assert torch.allclose(torch.nanmean(got, dim=1)[some], want.to(got.dtype)[some])
        assert torch.equal(d.p_mask[:, c] == 0, ~d.mask[:, c])


def test_d1_masks_prompt_rate_and_full_completion():
    B, P, R = 64, 32, 8
    am = torch.ones(B, P + R, dtype=torch.long)
    am[:, :3] = 0  # left pads are never masked
    am[:, -2:] = 0  # right pads neither
    rates = []
    for s in range(10):
        d = d1_masks(am, P, generator=gen(s))
        _, response = prompt_response_masks(am, P)
        assert torch.equal(d.mask[:, 0, P:], response[:, P:])
        assert not bool(d.mask[:, 0, :3].any()) and not bool(d.mask[:, 0, -2:].any())
        rates.append(d.mask[:, 0, 3:P].float().mean().item())
    assert abs(sum(rates) / len(rates) - 0.15) < 0.01  # 18560 draws: sd ~ 0.0026


def test_spg_block_structure():
    P, bl = 2, 4
    am = torch.ones(20, P + 4 * bl, dtype=torch.long)
    am[10:, P + 3 * bl - 1:] = 0  # half the rows end inside block 2 (11 valid tokens)
    for mask_prompt in (False, True):
        d = spg_block_masks(am, P, generator=gen(9), block_length=bl, n=3, mask_prompt=mask_prompt)
        for b in range(20):
            clen = int(am[b, P:].sum())
            for j in range(3):
                m = d.mask[b, j, P:]
                before_p = 0.15 if mask_prompt else 0.0
                p_row = d.p_mask[b, j, P:]
                before = torch.tensor(before_p, dtype=p_row.dtype)
                k = next(c for c in range(4) if not torch.isclose(p_row[c * bl], before))
                assert torch.allclose(d.p_mask[b, j, :P + k * bl], torch.tensor(before_p, dtype=p_row.dtype))
                len_k = min(bl, clen - k * bl)
                assert 1 <= int(m[k * bl:k * bl + len_k].sum()) <= len_k  # block k: 1..len_k masks
                assert bool(m[k * bl + len_k:].all())  # later blocks and padding fully masked
                assert k * bl < clen  # the chosen block holds completion tokens
                if not mask_prompt:
                    assert not bool(m[:k * bl].any()) and not bool(d.mask[b, j, :P].any())
                got_p = d.p_mask[b, j, P + k * bl]
                want_p = m[k * bl:k * bl + len_k].sum() / torch.tensor(float(len_k), dtype=got_p.dtype)
                assert torch.isclose(got_p, want_p)


def test_ebpo_every_block_masked_and_levels_stratified():
    am, _ = layout(B=3, P=4, R=8, prompt_pads=(0, 1, 2), response_lens=(8, 5, 7))
    bi = ebpo_block_index(am, 4, 3)
    # global origin: compact position = valid prompt tokens + offset;
    # row 1 has 3 prompt tokens -> compact 3..7 -> raw blocks 1,1,1,2,2 -> renumbered [0,0,0,1,1]
    assert bi[1, 4:9].tolist() == [0, 0, 0, 1, 1]
    assert bi[0, 4:12].tolist() == [0, 0, 1, 1, 1, 2, 2, 2]  # 4 prompt tokens: first block has 2 completion tokens
    assert (ebpo_block_index(am, 4, 3, "response")[0, 4:12]).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    d = ebpo_block_masks(am, 4, generator=gen(10), block_length=3, n=4)
    for b in range(3):
        nb = int(bi[b].max()) + 1
        levels = d.t[b, :, :nb].flatten()
        N = levels.numel()
        strata = torch.floor(levels.double() * N).long().sort().values
        assert strata.tolist() == list(range(N))  # one level in each stratum [c/N, (c+1)/N)
        for j in range(4):
            for c in range(nb):
                blk = bi[b] == c
                cnt = int((d.mask[b, j] & blk).sum())
                assert cnt == ebpo_mask_count(float(d.t[b, j, c]), int(blk.sum())) >= 1
                assert torch.allclose(d.p_mask[b, j][d.mask[b, j] & blk], torch.tensor(cnt / int(blk.sum())))
    assert ebpo_mask_count(0.0, 5) == 1 and ebpo_mask_count(0.999, 5) == 5 and ebpo_mask_count(1.0, 5) == 5


def test_espo_levels_and_complement():
    for L, n in ((4, 5), (8, 4), (3, 2)):
        for k in range(L + 1):
            x = espo_mask_counts(k, L, n)
            assert bool(((x >= 0) & (x <= L)).all())
        if n == L + 1:
            for k in range(L + 1):
                assert sorted(espo_mask_counts(k, L, n).tolist()) == list(range(L + 1))
    am, _ = layout()
    d = espo_masks(am, 4, generator=gen(12), n=3, repeats=2)
    L_valid = d.response_mask.sum(-1, keepdim=True).float()
    counts = d.loss_mask.sum(-1).float()
    assert torch.allclose(d.p_mask[:, :, 0], counts / (L_valid + 1))
    assert torch.allclose(d.p_complement[:, :, 0], L_valid / (L_valid + 1) - d.p_mask[:, :, 0])
    comp = d.complement()
    assert not bool((comp.loss_mask & d.loss_mask).any())
    assert torch.equal(comp.loss_mask | d.loss_mask, d.response_mask[:, None].expand_as(d.mask))
    with pytest.raises(ConfigError):
        stratified_masks(am, 4, generator=gen(), n=2).complement()


def test_maskdraw_select_rejects_bad_index():
    am, _ = layout()
    d = stratified_masks(am, 4, generator=gen(), n=2)
    assert isinstance(d.select([1, 0]), MaskDraw)
    with pytest.raises(ConfigError):
        d.select(2)


def test_maskdraw_rows_concat_and_dict_roundtrip():
    am, ids = layout()
    d = ebpo_block_masks(am, 4, generator=gen(13), block_length=3, n=2)
    parts = [d.rows(slice(0, 1)), d.rows([1, 2])]
    back = MaskDraw.concat(parts)
    for name in ("mask", "p_mask", "response_mask", "t", "block_index"):
        assert torch.equal(getattr(back, name), getattr(d, name))
    again = MaskDraw.from_dict(d.to_dict())
    assert torch.equal(again.mask, d.mask) and again.scheme == d.scheme and again.p_complement is None
    assert torch.equal(d.select(-1).mask, d.select(1).mask)
    with pytest.raises(ConfigError):
        MaskDraw.concat([d, coupled_masks(am, 4, generator=gen())])
