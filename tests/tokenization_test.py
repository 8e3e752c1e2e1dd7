"""A tokenizer that does not fit its model is refused before any work."""

import os
import shutil

import numpy as np
import pytest

from papa_jax import convert, run, tokenization
from tests.testing import MINILM, require_shared, tiny_config


def _minilm_copy(tmp_path, keep_tokenizer: bool):
  src = convert.packaged_model_dir(MINILM)
  if src is None:
    pytest.skip("all-MiniLM-L6-v2 package not installed")
  dst = tmp_path / "model"
  dst.mkdir()
  for name in ("config.json", "model.safetensors"):
    os.symlink(os.path.join(src, name), dst / name)
  if keep_tokenizer:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
      shutil.copy(os.path.join(src, name), dst / name)
  return dst


@pytest.mark.unit
def test_invalid_model_dir_without_tokenizer_files_fails_before_any_work(tmp_path):
  model = _minilm_copy(tmp_path, keep_tokenizer=False)
  wd = tmp_path / "wd"
  with pytest.raises(tokenization.TokenizerError, match="has no tokenizer vocabulary"):
    run.run(tiny_config(tmp_path, **{"model.name": str(model)}), str(wd))
  assert not (wd / "config.json").exists() and not (wd / "means").exists()


@pytest.mark.unit
def test_invalid_near_empty_vocabulary_is_refused(tmp_path):
  model = _minilm_copy(tmp_path, keep_tokenizer=False)
  (model / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
  with pytest.raises(tokenization.TokenizerError, match="knows 5 tokens.*30522"):
    convert.load_pretrained(str(model)).tokenizer()


@pytest.mark.integration
def test_invalid_tokenizer_of_a_bigger_vocabulary_is_refused(tmp_path):
  tiny = tmp_path / "tiny"
  shutil.copytree(require_shared("fixtures", "tiny-random", "bert", "BertModel"), tiny)
  src = convert.packaged_model_dir(MINILM)
  if src is None:
    pytest.skip("all-MiniLM-L6-v2 package not installed")
  for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
    shutil.copy(os.path.join(src, name), tiny / name)
  with pytest.raises(tokenization.TokenizerError, match="30522 tokens but the model's "
                     "embedding table has 99 rows"):
    convert.load_pretrained(str(tiny)).tokenizer()


@pytest.mark.integration
def test_invalid_data_that_is_mostly_unknown_tokens(minilm_tokenizer):
  tok = minilm_tokenizer
  ids = np.full((4, 8), tok.unk_token_id)
  ids[:, 0], ids[:, 7] = tok.cls_token_id, tok.sep_token_id
  ids[:, 1] = 2000  # One real word per example: 1 of 6 pieces known.
  with pytest.raises(tokenization.TokenizerError, match="83% of the word pieces of x/train"):
    tokenization.check_unknown_rate(tok, ids, np.ones_like(ids), "x/train")
  ids[:, 1:6] = 2000
  assert tokenization.check_unknown_rate(tok, ids, np.ones_like(ids), "x") == pytest.approx(1 / 6)


@pytest.mark.unit
def test_tokenizer_fingerprint_follows_the_vocabulary(tmp_path):
  model = _minilm_copy(tmp_path, keep_tokenizer=True)
  before = tokenization.tokenizer_fingerprint(str(model))
  with open(model / "vocab.txt", "a") as f:
    f.write("extra\n")
  assert tokenization.tokenizer_fingerprint(str(model)) != before
