"""Properties of the KV-cache engine: it decodes exactly what a cache-free model would, row by row, in order."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from memagent.rollout import GenerateOutput, SamplingParams, generate

GREEDY = SamplingParams(temperature=0.0)
PROMPT_LENGTHS = (3, 11, 6, 1, 8)


@pytest.fixture
def prompts(model: PreTrainedModel) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def no_cache_greedy(model: PreTrainedModel, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding that re-runs the whole unpadded sequence every step (no cache). Returns ids, log-probs."""
    ids, logps = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            ids.append(int(logits.argmax()))
            logps.append(logits.log_softmax(-1).max())
    return ids[len(prompt) :], torch.stack(logps)


def recompute_logprobs(model: PreTrainedModel, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of `tokens` after `prompt`, from one forward over the unpadded sequence."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float() / temperature
    return logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_greedy_matches_hf_generate_on_left_padded_prompts(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    steps = 12
    reference, _ = no_cache_greedy(model, prompts[1], steps)
    eos = reference[5]  # a token the model does produce, so some rows stop early
    out = generate(model, prompts, max_new_tokens=steps, eos_token_id=eos, params=GREEDY)

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    hf = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=steps,
                        eos_token_id=eos, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    for row in range(len(prompts)):
        hf_tokens = hf.sequences[row, width:].tolist()
        if eos in hf_tokens:
            hf_tokens = hf_tokens[: hf_tokens.index(eos) + 1]
        assert out.tokens[row] == hf_tokens
        assert out.finished[row] == (hf_tokens[-1] == eos)
        hf_logps = torch.stack([hf.logits[s][row].float().log_softmax(-1)[t] for s, t in enumerate(hf_tokens)])
        torch.testing.assert_close(out.logprobs[row], hf_logps, atol=1e-4, rtol=1e-4)
    assert any(out.finished) and not all(out.finished)


def test_kv_cache_greedy_matches_no_cache_recomputation(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    steps = 10
    out = generate(model, prompts, max_new_tokens=steps, eos_token_id=None, params=GREEDY)
    for row, prompt in enumerate(prompts):
        tokens, logps = no_cache_greedy(model, prompt, steps)
        assert out.tokens[row] == tokens
        torch.testing.assert_close(out.logprobs[row], logps, atol=1e-4, rtol=1e-4)
    assert out.finished == [False] * len(prompts)


def test_eager_attention_decodes_like_sdpa(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    # SDPA gets a ready 4D decode mask, other kernels the 2D one: both must give the same continuation.
    sdpa = generate(model, prompts, max_new_tokens=8, eos_token_id=None, params=GREEDY)
    model.set_attn_implementation("eager")
    eager = generate(model, prompts, max_new_tokens=8, eos_token_id=None, params=GREEDY)
    assert eager.tokens == sdpa.tokens
    for a, b in zip(eager.logprobs, sdpa.logprobs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_sampled_logprobs_equal_a_forward_recomputation(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.7)
    out = generate(model, prompts, max_new_tokens=9, eos_token_id=None, params=params,
                   generator=torch.Generator().manual_seed(0))
    for row, prompt in enumerate(prompts):
        expected = recompute_logprobs(model, prompt, out.tokens[row], 0.7)
        torch.testing.assert_close(out.logprobs[row], expected, atol=1e-4, rtol=1e-4)


def test_seeded_generation_is_reproducible_and_seeds_differ(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    def run(seed: int) -> GenerateOutput:
        return generate(model, prompts, max_new_tokens=8, eos_token_id=None, params=SamplingParams(top_p=0.95),
                        generator=torch.Generator().manual_seed(seed))

    a, b, c = run(1), run(1), run(2)
    assert a.tokens == b.tokens and all(torch.equal(x, y) for x, y in zip(a.logprobs, b.logprobs))
    assert a.tokens != c.tokens


def test_rows_finishing_at_different_steps_keep_input_order_and_their_own_eos(
    model: PreTrainedModel, prompts: list[list[int]]
) -> None:
    steps = 12
    alone = [no_cache_greedy(model, p, steps)[0] for p in prompts]
    # Stop each of two rows on a token it makes at a different step; with both as EOS, every row stops at the
    # first of them it produces, and removing finished rows from the batch must not disturb the others.
    eos = [alone[0][2], alone[3][7]]
    out = generate(model, prompts, max_new_tokens=steps, eos_token_id=eos, params=GREEDY)
    lengths = set()
    for row, tokens in enumerate(alone):
        stop = next((i for i, t in enumerate(tokens) if t in eos), None)
        expected = tokens if stop is None else tokens[: stop + 1]
        assert out.tokens[row] == expected
        assert out.finished[row] == (stop is not None)
        assert out.logprobs[row].shape == (len(expected),)
        lengths.add(len(expected))
    assert len(lengths) >= 3


def test_per_row_max_new_tokens_cut_each_row(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    limits = [4, 0, 7, 1, 2]
    out = generate(model, prompts, max_new_tokens=limits, eos_token_id=None, params=GREEDY)
    for row, limit in enumerate(limits):
        expected = no_cache_greedy(model, prompts[row], limit)[0] if limit else []
        assert out.tokens[row] == expected
        assert len(out.logprobs[row]) == limit
    assert out.finished == [False] * len(prompts)


def test_empty_inputs_and_zero_budgets_give_empty_outputs(model: PreTrainedModel) -> None:
    assert generate(model, [], max_new_tokens=5, eos_token_id=2) == GenerateOutput([], [], [])
    out = generate(model, [[5, 6], [7]], max_new_tokens=0, eos_token_id=2)
    assert out.tokens == [[], []] and out.finished == [False, False]
    assert [t.shape for t in out.logprobs] == [(0,), (0,)]


@pytest.mark.parametrize(
    ("prompts", "max_new_tokens", "match"),
    [([[1, 2], []], 3, "prompts\\[1\\]"), ([[1, 2]], [3, 4], "max_new_tokens"), ([[1, 2]], -1, "max_new_tokens")],
)
def test_bad_inputs_raise(model: PreTrainedModel, prompts: list[list[int]], max_new_tokens, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=None)


def test_outputs_are_ordinary_cpu_float32_tensors(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    out = generate(model, prompts, max_new_tokens=3, eos_token_id=None, generator=torch.Generator().manual_seed(0))
    for logps in out.logprobs:
        assert logps.dtype == torch.float32 and logps.device.type == "cpu"
        assert not logps.is_inference()  # the trainer may save them for backward
        assert (logps <= 0).all()
