"""PAPA layout golden cases (spec §3 and §11 test 4) and real-tokenizer invariants."""

import numpy as np
import pytest

from papa_jax.data import preprocess, tasks

CLS, SEP, PAD = 101, 102, 0


def layout(ids, types, L, faithful=True, sep=SEP, pad=PAD):
  return preprocess.papa_sentence_layout(ids, types, sep, pad, L, faithful)


@pytest.mark.unit
def test_layout_spec_worked_example_pair():
  # [CLS] a b [SEP] c d [SEP] (then PAD) -> [CLS] a b PAD [SEP] c d [SEP].
  ids, mask, tt, dropped = layout([CLS, 1, 2, SEP, 3, 4, SEP], [0, 0, 0, 0, 1, 1, 1], 8)
  np.testing.assert_array_equal(ids, [CLS, 1, 2, PAD, SEP, 3, 4, SEP])
  np.testing.assert_array_equal(mask, [1, 1, 1, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(tt, [0, 0, 0, 0, 1, 1, 1, 0])  # Faithful: old ids kept.
  assert not dropped
  _, _, tt, _ = layout([CLS, 1, 2, SEP, 3, 4, SEP], [0, 0, 0, 0, 1, 1, 1], 8, faithful=False)
  np.testing.assert_array_equal(tt, [0, 0, 0, 0, 0, 1, 1, 1])  # Corrected.


@pytest.mark.unit
def test_layout_single_sentence_second_half_is_padding():
  ids, mask, _, dropped = layout([CLS, 1, 2, SEP], [0] * 4, 8)
  np.testing.assert_array_equal(ids, [CLS, 1, 2, PAD, PAD, PAD, PAD, SEP])
  np.testing.assert_array_equal(mask, [1, 1, 1, 0, 0, 0, 0, 1])
  assert not dropped


@pytest.mark.unit
def test_layout_long_first_segment_keeps_half_minus_one_pieces():
  ids, mask, _, dropped = layout([CLS, 1, 2, 3, 4, 5, 6, SEP], [0] * 8, 8)
  np.testing.assert_array_equal(ids, [CLS, 1, 2, 3, PAD, PAD, PAD, SEP])
  assert dropped and mask.sum() == 5


@pytest.mark.unit
def test_layout_long_second_segment_keeps_half_minus_two_pieces():
  ids, _, _, dropped = layout([CLS, 1, SEP, 3, 4, 5, 6, SEP], [0, 0, 0, 1, 1, 1, 1, 1], 8)
  np.testing.assert_array_equal(ids, [CLS, 1, PAD, PAD, SEP, 3, 4, SEP])
  assert dropped


@pytest.mark.unit
def test_layout_roberta_double_separator():
  bos, eos, pad = 0, 2, 1  # <s> a </s></s> b </s>
  ids, mask, _, _ = layout([bos, 5, eos, eos, 6, eos], [0] * 6, 8, sep=eos, pad=pad)
  np.testing.assert_array_equal(ids, [bos, 5, pad, pad, eos, eos, 6, eos])
  np.testing.assert_array_equal(mask, [1, 1, 0, 0, 1, 1, 1, 1])


@pytest.mark.integration
def test_encode_sst2_real_tokenizer_invariants(minilm_tokenizer):
  task = tasks.get_task("sst2")
  recs = [dict(idx=i, text_a=t, text_b="", label=i % 2) for i, t in enumerate(
      ["a gorgeous film .", "x " * 40, "dull"])]
  enc = preprocess.encode(task, recs, minilm_tokenizer, 16)
  assert enc.input_ids.shape == (3, 16) and enc.input_ids.dtype == np.int32
  assert np.all(enc.input_ids[:, 0] == CLS) and np.all(enc.input_ids[:, 15] == SEP)
  assert np.all(enc.attention_mask[:, 8:15] == 0)  # Second half is padding.
  assert enc.attention_mask[1, :8].sum() == 8  # Truncated to L/2 - 1 pieces + [CLS].
  assert enc.truncated == 1
  plain = preprocess.encode(task, recs, minilm_tokenizer, 16, papa_layout=False)
  want = minilm_tokenizer([r["text_a"] for r in recs], padding="max_length",
                          truncation=True, max_length=16)
  np.testing.assert_array_equal(plain.input_ids, want["input_ids"])


@pytest.mark.integration
def test_encode_ner_labels_on_first_subtokens(minilm_tokenizer):
  task = tasks.get_task("ner")
  recs = [dict(idx=0, tokens=["Heidelberg", "rejects", "unbelievably"], tags=[5, 0, 0])]
  enc = preprocess.encode(task, recs, minilm_tokenizer, 12)
  raw = minilm_tokenizer([recs[0]["tokens"]], is_split_into_words=True)
  word_ids = raw.word_ids(0)
  firsts = [word_ids.index(w) for w in range(3)]
  want = np.full(12, preprocess.IGNORE)
  want[firsts] = [5, 0, 0]
  np.testing.assert_array_equal(enc.labels[0], want)
  n = len(raw["input_ids"][0])
  assert enc.input_ids[0, n - 1] == PAD and enc.attention_mask[0, n - 1] == 0  # Old [SEP].
  assert enc.input_ids[0, 11] == SEP and enc.attention_mask[0, 11] == 1


@pytest.mark.integration
def test_invalid_tokens_and_tags_disagree(minilm_tokenizer):
  with pytest.raises(ValueError, match="2 tokens but 1 tags"):
    preprocess.encode(tasks.get_task("ner"), [dict(idx=3, tokens=["a", "b"], tags=[0])],
                      minilm_tokenizer, 12)


@pytest.mark.integration
def test_encode_tags_words_without_a_word_piece_are_counted_apart_from_truncation(
    minilm_tokenizer):
  """A soft hyphen or zero-width space has no word piece: its tag cannot be scored, which
  is said as such, not counted as truncation (which only a full sequence can be)."""
  task = tasks.get_task("ner")
  recs = [dict(idx=0, tokens=["EU", "\u00ad", "rejects", "\u200b"], tags=[3, 0, 0, 0]),
          dict(idx=1, tokens=["a"] * 20, tags=[0] * 20)]
  enc = preprocess.encode(task, recs, minilm_tokenizer, 12)
  assert (enc.unpieced, enc.unpieced_words) == (2, ("\u00ad", "\u200b"))
  assert enc.truncated == 1  # The 20-word sentence only.
  assert (enc.labels[0] != preprocess.IGNORE).sum() == 2  # EU, rejects.
  whole = preprocess.encode(task, recs[:1], minilm_tokenizer, 12)
  assert (whole.truncated, whole.unpieced) == (0, 2)
  assert whole.take(np.array([0])).unpieced == 2


@pytest.mark.integration
def test_encode_sentences_counts_texts_without_a_word_piece(minilm_tokenizer):
  task = tasks.get_task("mrpc")
  recs = [dict(idx=0, text_a="fine", text_b="\u200b\u00ad", label=0),
          dict(idx=1, text_a="\u200b", text_b="also fine", label=1),
          dict(idx=2, text_a="a", text_b="b", label=1)]
  enc = preprocess.encode(task, recs, minilm_tokenizer, 16)
  assert (enc.unpieced, enc.unpieced_words) == (2, ("\u200b", "\u200b\u00ad"))
