"""Chunked log-probs equal the naive full log-softmax, in value and in gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from memagent.model import load_model
from memagent.model.logprobs import TokenLogprobs, token_logprobs
from memagent.rollout import generate
from memagent.rollout.sampling import SamplingParams


def naive_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0):
    """Reference: full [B, T, V] float32 log-softmax of model(...).logits; [B, T] log-probs and entropies."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    z = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float() / temperature
    logp_all = F.log_softmax(z[:, :-1], dim=-1)  # [B, T-1, V]
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    keep = mask[:, 1:].bool() & mask[:, :-1].bool()
    zero = torch.zeros_like(ids[:, :1], dtype=torch.float32)
    logp = torch.cat([zero, torch.where(keep, logp, 0.0)], dim=1)
    entropy = torch.cat([zero, torch.where(keep, entropy, 0.0)], dim=1)
    return logp, entropy


def left_padded_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of lengths 37, 20 and 5, left-padded to T = 37 with pad id 0."""
    g = torch.Generator().manual_seed(seed)
    lengths = [37, 20, 5]
    ids = torch.zeros(3, 37, dtype=torch.long)
    mask = torch.zeros(3, 37, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, 37 - n :] = torch.randint(3, vocab, (n,), generator=g)
        mask[row, 37 - n :] = 1
    return ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("chunk_tokens", [7, 1024])
def test_chunked_equals_naive_in_value_and_entropy(tiny_model, temperature: float, chunk_tokens: int) -> None:
    ids, mask = left_padded_batch(tiny_model.config.vocab_size)
    with torch.no_grad():
        got = token_logprobs(
            tiny_model, ids, mask, temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=True
        )
        want_logp, want_ent = naive_logprobs(tiny_model, ids, mask, temperature)
    assert isinstance(got, TokenLogprobs)
    assert got.logprobs.shape == ids.shape and got.logprobs.dtype == torch.float32
    torch.testing.assert_close(got.logprobs, want_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.entropy, want_ent, rtol=0, atol=1e-5)


def test_chunked_gradient_equals_naive_gradient(tiny_model_dir) -> None:
    chunked, naive = (load_model(tiny_model_dir, device="cpu").train() for _ in range(2))
    ids, mask = left_padded_batch(chunked.config.vocab_size, seed=1)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    got = token_logprobs(chunked, ids, mask, temperature=0.8, chunk_tokens=16, with_entropy=True)
    want_logp, want_ent = naive_logprobs(naive, ids, mask, temperature=0.8)
    ((got.logprobs * weights).sum() + got.entropy.sum() * 0.1).backward()
    ((want_logp * weights).sum() + want_ent.sum() * 0.1).backward()
    for (name, p), q in zip(chunked.named_parameters(), naive.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-5, msg=name)


def test_padding_positions_and_first_position_are_zero(tiny_model) -> None:
    ids, mask = left_padded_batch(tiny_model.config.vocab_size)
    with torch.no_grad():
        out = token_logprobs(tiny_model, ids, mask, with_entropy=True)
    assert bool((out.logprobs[:, 0] == 0).all())
    assert bool((out.logprobs[mask == 0] == 0).all()) and bool((out.entropy[mask == 0] == 0).all())
    first_real = mask.argmax(-1)  # [B]: each row's first real token has no prefix, so it holds 0 too
    assert bool((out.logprobs[torch.arange(3), first_real] == 0).all())
    with_prefix = mask.bool().clone()
    with_prefix[torch.arange(3), first_real] = False
    assert bool((out.logprobs[with_prefix] < 0).all()) and bool((out.entropy[with_prefix] > 0).all())


def test_left_padding_does_not_change_a_rows_logprobs(tiny_model) -> None:
    ids, mask = left_padded_batch(tiny_model.config.vocab_size)
    with torch.no_grad():
        batched = token_logprobs(tiny_model, ids, mask).logprobs
        alone = token_logprobs(tiny_model, ids[1:2, -20:], mask[1:2, -20:]).logprobs
    torch.testing.assert_close(batched[1:2, -20:], alone, rtol=0, atol=1e-5)


def test_right_padding_is_supported(tiny_model) -> None:
    ids, mask = left_padded_batch(tiny_model.config.vocab_size)
    right_ids, right_mask = ids.clone(), mask.clone()
    right_ids[2] = torch.cat([ids[2, -5:], ids[2, :-5]])
    right_mask[2] = torch.cat([mask[2, -5:], mask[2, :-5]])
    with torch.no_grad():
        left = token_logprobs(tiny_model, ids, mask).logprobs
        right = token_logprobs(tiny_model, right_ids, right_mask).logprobs
    torch.testing.assert_close(right[2, :5], left[2, -5:], rtol=0, atol=1e-5)
    assert bool((right[2, 5:] == 0).all())


def test_target_mask_computes_only_selected_positions(tiny_model) -> None:
    ids, mask = left_padded_batch(tiny_model.config.vocab_size)
    target = torch.zeros_like(mask, dtype=torch.bool)
    target[:, -4:] = True
    with torch.no_grad():
        full = token_logprobs(tiny_model, ids, mask).logprobs
        part = token_logprobs(tiny_model, ids, mask, target_mask=target).logprobs
    torch.testing.assert_close(part[:, -4:], full[:, -4:], rtol=0, atol=0)
    assert bool((part[:, :-4] == 0).all())


def test_logprobs_at_temperature_normalise_to_one(tiny_model) -> None:
    """Summing exp(log p) over every candidate next token gives 1: the temperature is a proper softmax."""
    ids = torch.tensor([[5, 9, 17, 4]])
    vocab = tiny_model.config.vocab_size
    candidates = torch.cat([ids.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)  # [V, 5]
    with torch.no_grad():
        out = token_logprobs(tiny_model, candidates, torch.ones_like(candidates), temperature=0.5)
    torch.testing.assert_close(out.logprobs[:, -1].exp().sum(), torch.tensor(1.0), rtol=0, atol=1e-5)


def test_single_token_sequences_give_zeros(tiny_model) -> None:
    ids = torch.tensor([[5], [6]])
    out = token_logprobs(tiny_model, ids, torch.ones_like(ids), with_entropy=True)
    assert out.logprobs.shape == (2, 1) and bool((out.logprobs == 0).all()) and bool((out.entropy == 0).all())


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"temperature": 0.0}, "temperature"), ({"chunk_tokens": 0}, "chunk")]
)
def test_bad_arguments_are_refused(tiny_model, kwargs: dict, message: str) -> None:
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=message):
        token_logprobs(tiny_model, ids, torch.ones_like(ids), **kwargs)


def largest_saved_logits(fn, model) -> int:
    """Run `fn`; numel of the largest [..., V] tensor autograd saves for backward outside checkpoints, not
    counting the head weight itself."""
    vocab, weight = model.config.vocab_size, model.get_output_embeddings().weight
    sizes = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        is_weight = t.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
        if vocab in t.shape and t.dim() >= 2 and not is_weight:
            sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def test_no_vocab_sized_logits_are_kept_for_backward(tiny_model) -> None:
    tiny_model.train()
    vocab = tiny_model.config.vocab_size
    ids = torch.randint(3, vocab, (2, 200), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    naive = largest_saved_logits(lambda: naive_logprobs(tiny_model, ids, mask), tiny_model)
    chunked = largest_saved_logits(lambda: token_logprobs(tiny_model, ids, mask, chunk_tokens=16), tiny_model)
    assert naive >= ids.numel() * vocab * 0.9  # the hook does see the naive [B, T, V] tensor
    assert chunked == 0  # each chunk's logits live only inside its checkpoint


def test_gradients_match_naive_under_layer_checkpointing(tiny_model_dir) -> None:
    chunked = load_model(tiny_model_dir, device="cpu", gradient_checkpointing=True).train()
    naive = load_model(tiny_model_dir, device="cpu").train()
    ids, mask = left_padded_batch(naive.config.vocab_size, seed=4)
    token_logprobs(chunked, ids, mask, chunk_tokens=8).logprobs.sum().backward()
    naive_logprobs(naive, ids, mask)[0].sum().backward()
    for (name, p), q in zip(chunked.named_parameters(), naive.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-5, msg=name)


def test_recomputed_logprobs_match_sampler_logprobs_at_temperature(tiny_model) -> None:
    """Training recomputes exactly the log-probs that generation recorded (plain sampling at temperature 0.7)."""
    prompts = [[5, 9, 17, 4, 33], [7, 8]]
    out = generate(
        tiny_model,
        prompts,
        max_new_tokens=12,
        eos_token_id=None,
        params=SamplingParams(temperature=0.7),
        generator=torch.Generator().manual_seed(0),
    )
    for prompt, tokens, sampled_logp in zip(prompts, out.tokens, out.logprobs, strict=True):
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            recomputed = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.7).logprobs
        torch.testing.assert_close(recomputed[0, len(prompt) :], sampled_logp.float(), rtol=0, atol=1e-5)


def head_calls(model, ids: torch.Tensor, mask: torch.Tensor, target: torch.Tensor, chunk_tokens: int) -> int:
    """How many times token_logprobs calls the output head module (under ZeRO-3 each call is an all-gather)."""
    calls = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        token_logprobs(model, ids, mask, chunk_tokens=chunk_tokens, target_mask=target)
    finally:
        handle.remove()
    return len(calls)


def test_output_head_is_called_as_often_whatever_the_number_of_target_tokens(tiny_model) -> None:
    ids, mask = left_padded_batch(tiny_model.config.vocab_size)
    targets = {"none": torch.zeros_like(ids, dtype=torch.bool), "last row": (torch.arange(3)[:, None] == 2).expand_as(ids),
               "all": torch.ones_like(ids, dtype=torch.bool)}  # 0, 4 and 58 target tokens: 0, 1 and 15 chunks of 4
    counts = {name: head_calls(tiny_model, ids, mask, target, chunk_tokens=4) for name, target in targets.items()}
    assert len(set(counts.values())) == 1, counts


def rows_of_varied_lengths(vocab: int) -> list:
    from memagent.records import TrainRow

    g = torch.Generator().manual_seed(3)
    out = []
    for i, (p, r) in enumerate([(30, 6), (5, 3), (18, 9), (7, 2), (25, 5), (9, 7), (12, 4), (4, 8)]):
        ids = torch.randint(3, vocab, (p + r,), generator=g).tolist()
        out.append(TrainRow(ids, p, [1] * r, advantage=float(i % 3) - 1.0))
    return out


def test_old_logprobs_equal_the_update_forward_bit_for_bit(tiny_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any update the ratio is exactly 1 on every mini-batch: the old-log-prob pass packs each mini-batch's
    micro-batches as the update does (a different padding changes float sums by ~1e-7)."""
    from memagent.config import LossConfig
    from memagent.rl import step

    rows = rows_of_varied_lengths(tiny_model.config.vocab_size)
    minis = step.split_mini_batches(rows, 2)
    kw = dict(budget=120, pad_id=0, temperature=1.0, device=torch.device("cpu"))
    counts = step.micro_batch_counts(minis, kw["budget"], lambda t: t.clone())
    step.set_logprobs(tiny_model, minis, counts, "old_logprobs", **kw)
    seen = []
    real_loss = step.policy_loss
    monkeypatch.setattr(step, "policy_loss", lambda logp, old, adv, m, **k: (
        seen.append((logp.detach(), old, m)), real_loss(logp, old, adv, m, **k))[1])
    for mini, count in zip(minis, counts):
        n = sum(r.num_trained_tokens for r in mini)
        step.accumulate_gradients(tiny_model, mini, **LossConfig().update_args(), num_tokens=n, num_seqs=len(mini), world_size=1,
                                  backward=lambda loss, last: None, num_micro=count, **kw)
    assert sum(int(m.sum()) for _, _, m in seen) == sum(r.num_trained_tokens for r in rows)
    for logp, old, m in seen:
        assert torch.equal(logp[m], old[m]), float((logp[m] - old[m]).abs().max())
