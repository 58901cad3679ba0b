"""SFT invariants (algorithms.md §2.1, §2.3)."""

import math

import pytest
import torch
from torch import nn

from dare_bench.models.base import ModelTraits
from dare_bench.trainers.lora import apply_lora
from dare_bench.trainers.sft import (
    LoraSettings,
    SFTConfig,
    SFTExample,
    collate,
    draw_sft_noise,
    sft_loss,
    train_sft,
)


class ConstantModel(nn.Module):
    """Puts probability q on token 0 at every position, whatever the input."""

    def __init__(self, q: float, vocab: int = 4, shift: int = 0):
        super().__init__()
        rest = (1 - q) / (vocab - 1)
        self.logits = nn.Parameter(torch.log(torch.tensor([q] + [rest] * (vocab - 1))))
        self.traits = ModelTraits("toy", mask_token_id=vocab - 1, eos_token_id=0, pad_token_id=0,
                                  logit_shift=shift, attention="bidirectional")

    def forward(self, ids, attention_mask=None, **_):
        return self.logits.expand(ids.shape[0], ids.shape[1], -1)


def test_prompt_never_masked_and_at_least_one_answer_token():
    ids = torch.arange(1, 11).repeat(64, 1)
    plen = torch.full((64,), 4)
    gen = torch.Generator().manual_seed(0)
    noisy, masked, p = draw_sft_noise(ids, plen, mask_id=99, generator=gen, eps=1e-3)
    assert not masked[:, :4].any()
    assert (noisy[:, :4] == ids[:, :4]).all()
    assert masked[:, 4:].any(dim=1).all()
    assert ((noisy == 99) == masked).all()
    assert ((p >= 1e-3) & (p <= 1)).all()


def test_importance_weighting_is_unbiased():
    # E[m_i / p] = 1, so a model giving the true token probability q everywhere has E[loss] = -log q.
    q = 0.3
    model = ConstantModel(q)
    ids = torch.zeros(4096, 12, dtype=torch.long)
    plen = torch.full((4096,), 4)
    gen = torch.Generator().manual_seed(1)
    alen = torch.full((4096,), 8)
    with torch.no_grad():
        losses = [float(_unforced_loss(model, ids, plen, alen, gen)) for _ in range(4)]
    assert sum(losses) / len(losses) == pytest.approx(-math.log(q), rel=0.03)


def _unforced_loss(model, ids, plen, alen, gen):
    import torch.nn.functional as F

    noisy, masked, p = draw_sft_noise(ids, plen, model.traits.mask_token_id, gen, 1e-3, force_one=False)
    logits = model(noisy)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="none").view(ids.shape)
    return ((ce * masked / p[:, None]).sum(1) / alen).mean()


def test_collate_pads_answer_with_eos():
    ids, plen, alen = collate([SFTExample([5, 6], [7, 0]), SFTExample([5], [7, 8, 9, 0])], eos_id=0)
    assert ids.tolist() == [[5, 6, 7, 0, 0], [5, 7, 8, 9, 0]]
    assert plen.tolist() == [2, 1] and alen.tolist() == [3, 4]


def test_lora_with_zero_b_gives_the_full_model_loss():
    from dare_bench.models import load_pretrained

    model = load_pretrained("tiny-llada")
    ids = torch.randint(0, 50, (4, 16))
    plen, alen = torch.full((4,), 6), torch.full((4,), 10)
    full = sft_loss(model, ids, plen, alen, torch.Generator().manual_seed(3))
    wrapped = apply_lora(model, LoraSettings(r=4, alpha=8))
    lora = sft_loss(wrapped, ids, plen, alen, torch.Generator().manual_seed(3))
    assert torch.equal(full, lora)
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_sft_reduces_loss_on_a_copy_task():
    from dare_bench.models import load_pretrained

    torch.manual_seed(0)
    model = load_pretrained("tiny-llada")
    vocab_hi = 40
    examples = []
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        prompt = torch.randint(1, vocab_hi, (6,), generator=g).tolist()
        examples.append(SFTExample(prompt, prompt + [model.traits.eos_token_id]))
    cfg = SFTConfig(steps=120, lr=3e-3, batch_size=16, warmup_steps=5, seed=0)
    result = train_sft(model, examples, cfg)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-20:]) / 20
    assert last < 0.7 * first  # 1/p weighting makes single steps noisy: compare averages
