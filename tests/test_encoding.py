"""The shared, torch-free text encoding: clean-up, prompts, truncation, padding."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from kvembed.methods import demo_model_path, resolve
from kvembed.runtime.encoding import TextEncoder, check_texts, format_prompt, preprocess_text


@pytest.fixture()
def byte_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_path() / "tokenizer.json"))


@pytest.mark.parametrize(
    "raw,clean",
    [
        ("  A man   is\tplaying a guitar ", "A man is playing a guitar."),
        ("Why is the sky blue?", "Why is the sky blue."),
        ('He said "no"', "He said 'no'"),
        ("It's done'", "It's done'"),
        ("", ""),
        ("  \n ", ""),
        ("Ends with ?  ", "Ends with ."),
    ],
)
def test_official_preprocessing(raw, clean):
    assert preprocess_text(raw) == clean


def test_format_prompt_marks_the_last_copy():
    prompt, span = format_prompt("Rewrite the sentence: {text}, rewritten sentence: {text}", "ab")
    assert prompt == "Rewrite the sentence: ab, rewritten sentence: ab"
    assert prompt[span[0] : span[1]] == "ab" and span[1] == len(prompt)
    with pytest.raises(ValueError, match="no {text} field"):
        format_prompt("no field", "x")


def test_check_texts():
    assert check_texts(("a", "b")) == ["a", "b"]
    with pytest.raises(TypeError, match="list of str, got str"):
        check_texts("abc")
    with pytest.raises(TypeError, match=r"texts\[2\] is NoneType"):
        check_texts(["a", "b", None])


def test_truncation_keeps_the_template_and_fits(byte_tokenizer):
    encoder = TextEncoder(byte_tokenizer, resolve("kv-embedding", 5), max_length=64)
    item = encoder.encode_one("x" * 1000)
    assert item.truncated and len(item.ids) == 64
    text = bytes(i - 3 for i in item.ids[1:]).decode()  # byte-level ids: byte b -> id b + 3
    assert text.startswith('"Context: xxx') and text.endswith('" Compress the Context in one word:')
    with pytest.raises(ValueError, match="prompt template alone needs more"):
        TextEncoder(byte_tokenizer, resolve("kv-embedding", 5), max_length=10).encode_one("hello")


def test_truncation_warning_names_at_most_ten_texts(byte_tokenizer):
    """One warning line: the count, the limit, the first ten cut texts by their index in the
    whole stream (``first_index``), then how many more."""
    encoder = TextEncoder(byte_tokenizer, resolve("mean", 5), max_length=16)
    texts = ["short"] + ["y" * 40] * 12
    with pytest.warns(UserWarning) as caught:
        encoder.encode(texts, first_index=100)
    (warning,) = caught
    named = ", ".join(f"texts[{i}]" for i in range(101, 111))
    assert str(warning.message) == (
        f"12 of 13 text(s) exceed max_length=16 tokens and were cut to fit ({named} and 2 more); "
        "the prompt template is kept whole"
    )


def test_truncation_of_echo_cuts_both_copies(byte_tokenizer):
    """Both copies of the text are cut to the same prefix, and only the second one is pooled."""
    encoder = TextEncoder(byte_tokenizer, resolve("echo", 5), max_length=80)
    text = "abcdefghij" * 20
    item = encoder.encode_one(text)
    assert item.truncated and len(item.ids) <= 80
    prompt = bytes(i - 3 for i in item.ids[1:]).decode()  # byte-level ids: byte b -> id b + 3
    head, _, second = prompt.partition(", rewritten sentence: ")
    first = head.removeprefix("Rewrite the sentence: ")
    assert first == second and 0 < len(first) < len(text) and text.startswith(first)
    def prompt_tokens(n: int) -> int:
        return len(byte_tokenizer.encode(f"Rewrite the sentence: {text[:n]}, rewritten sentence: {text[:n]}").ids)

    assert prompt_tokens(len(first)) <= 80 < prompt_tokens(len(first) + 1)  # the longest prefix that fits
    pooled = bytes(item.ids[i] - 3 for i in item.pool).decode()
    assert pooled == second and item.pool[-1] == len(item.ids) - 1


def test_padding_sides_and_masks(byte_tokenizer):
    encoder = TextEncoder(byte_tokenizer, resolve("echo", 5), max_length=128, pad_id=0)
    items = encoder.encode(["a", "hello world"])
    right, left = encoder.pad(items, "right"), encoder.pad(items, "left")
    assert set(right) == {"input_ids", "attention_mask", "pool_mask"}
    for batch in (right, left):
        assert batch["input_ids"].dtype == np.int64
        assert (batch["attention_mask"].sum(1) == [len(i.ids) for i in items]).all()
        assert (batch["pool_mask"] <= batch["attention_mask"]).all()
    assert right["attention_mask"][0, 0] == 1 and left["attention_mask"][0, 0] == 0
    assert (right["pool_mask"].sum(1) == [1, 11]).all()  # byte-level: one token per byte of "a" / "hello world"
    with pytest.raises(ValueError, match="padding_side"):
        encoder.pad(items, "middle")


def test_plan_batches_respects_rows_and_token_budget():
    from kvembed.runtime.batching import plan_batches

    lengths = [5, 100, 7, 30, 30, 2, 64]
    plan = plan_batches(lengths, batch_size=3, max_batch_tokens=128)
    assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))
    for batch in plan:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 128
        widths = [lengths[i] for i in batch]
        assert widths == sorted(widths, reverse=True)
    assert plan[0] == [1]  # 100 tokens: two rows would exceed the budget
    assert plan_batches([3, 1, 2], batch_size=8) == [[0, 2, 1]]
    assert plan_batches([], batch_size=4) == []
    with pytest.raises(ValueError, match="max_batch_tokens must be an integer >= 1"):
        plan_batches([1], 4, max_batch_tokens=0)


def test_plan_batches_caps_padding():
    """With max_padding, no row of a batch is more than that fraction padding; every index is kept
    once, and batches stay as large as the cap allows (a row joins unless it would break it)."""
    import random

    from kvembed.runtime.batching import plan_batches

    rng = random.Random(0)
    lengths = [rng.randint(1, 300) for _ in range(500)]
    for cap in (0.0, 0.1, 0.3):
        plan = plan_batches(lengths, batch_size=64, max_batch_tokens=8192, max_padding=cap)
        assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))
        for batch, following in zip(plan, plan[1:] + [None]):
            width = max(lengths[i] for i in batch)
            assert all(lengths[i] >= (1 - cap) * width for i in batch)
            if following and len(batch) < 64 and (len(batch) + 1) * width <= 8192:
                assert lengths[following[0]] < (1 - cap) * width  # closed only because of padding
    padded = lambda plan: sum(len(b) * max(lengths[i] for i in b) for b in plan) / sum(lengths)
    assert padded(plan_batches(lengths, 64, 8192, max_padding=0.1)) <= 1.1
    assert plan_batches([10, 9, 5], batch_size=8, max_padding=0.2) == [[0, 1], [2]]
    with pytest.raises(ValueError, match=r"max_padding must be in \[0, 1\)"):
        plan_batches([1], 4, max_padding=1.0)


def _set_partitions(items: list[int]):
    """Every partition of ``items`` into non-empty groups (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def test_plan_batches_with_a_call_cost_is_the_cheapest_plan():
    """With call_cost, the plan's padded tokens + call_cost per call equal the minimum over every
    partition of the inputs into batches that respect the row and token limits (brute force over
    all set partitions, not only cuts of the sorted order), and every index appears once."""
    import random

    from kvembed.runtime.batching import plan_batches

    rng = random.Random(3)
    for trial in range(12):
        lengths = [rng.randint(1, 40) for _ in range(8)]
        batch_size, max_tokens, call_cost = rng.choice([2, 3, 8]), rng.choice([None, 60, 100]), rng.choice([0, 5, 20, 200])

        def allowed(batch: list[int]) -> bool:
            return len(batch) <= batch_size and (
                max_tokens is None or len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= max_tokens)

        def cost(plan: list[list[int]]) -> int:
            return sum(len(b) * max(lengths[i] for i in b) + call_cost for b in plan)

        best = min(cost(p) for p in _set_partitions(list(range(8))) if all(map(allowed, p)))
        plan = plan_batches(lengths, batch_size, max_tokens, call_cost=call_cost)
        assert sorted(i for batch in plan for i in batch) == list(range(8)), (trial, plan)
        assert all(map(allowed, plan)), (trial, plan)
        assert cost(plan) == best, (trial, lengths, batch_size, max_tokens, call_cost)
    # a long text over the budget still runs (alone); zero cost never pads; a huge cost makes the fewest calls
    assert plan_batches([500, 3, 3], 4, max_batch_tokens=100, call_cost=10) == [[0], [1, 2]]
    assert all(len({[9, 9, 4, 4, 4, 1][i] for i in b}) == 1 for b in plan_batches([9, 9, 4, 4, 4, 1], 8, call_cost=0))
    assert len(plan_batches(list(range(1, 11)), 4, call_cost=10**6)) == 3  # the fewest calls of <= 4 rows
    with pytest.raises(ValueError, match="call_cost must be an integer >= 0"):
        plan_batches([1], 4, call_cost=-1)
    with pytest.raises(ValueError, match="not both"):
        plan_batches([1], 4, max_padding=0.1, call_cost=8)
