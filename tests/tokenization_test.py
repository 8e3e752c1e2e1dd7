"""A tokenizer that does not fit its model is refused before any work."""

import json
import os
import shutil

import numpy as np
import pytest

from papa_jax import convert, run, tokenization
from papa_jax.models.config import EncoderConfig
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


def _minilm_tokenizer_copy(tmp_path, *names: str):
  """MiniLM's real tokenizer files `names` (all four by default) in tmp_path/tok."""
  src = convert.packaged_model_dir(MINILM)
  if src is None:
    pytest.skip("all-MiniLM-L6-v2 package not installed")
  dst = tmp_path / "tok"
  dst.mkdir()
  for name in names or ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                        "special_tokens_map.json"):
    shutil.copy(os.path.join(src, name), dst / name)
  return dst


def _table(rows: int) -> EncoderConfig:
  return EncoderConfig(vocab_size=rows, hidden_size=8, num_layers=1, num_heads=2,
                       intermediate_size=16, max_position_embeddings=32)


@pytest.mark.unit
@pytest.mark.parametrize("tokens,rows,ok", [
    (30522, 30522, True),  # BERT, ELECTRA, DistilBERT, MiniLM; MPNet 30527 = 30527.
    (50280, 50368, True),  # ModernBERT: rounded up to a multiple of 64.
    (128001, 128100, True),  # DeBERTa-v3: 99 spare rows.
    (250102, 251000, True),  # mDeBERTa-v3: 898 spare rows (0.4%).
    (1000, 1024, True),  # A small vocabulary padded to a multiple of 128.
    (1000, 1030, False),  # 30 spare rows of a table that is no multiple of 32: not padding.
    (20000, 30522, False),  # The reported truncated BERT vocab.txt.
    (28996, 30522, False),  # bert-base-cased's vocabulary with an uncased model.
])
def test_unused_rows_allowed_is_padding_only(tokens, rows, ok):
  assert (rows - tokens <= tokenization.unused_rows_allowed(rows)) == ok


@pytest.mark.unit
def test_invalid_truncated_vocab_txt_is_refused_naming_the_rows_without_a_token(tmp_path):
  tok_dir = _minilm_tokenizer_copy(tmp_path, "tokenizer_config.json", "vocab.txt",
                                   "special_tokens_map.json")
  lines = (tok_dir / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
  (tok_dir / "vocab.txt").write_text("".join(lines[:20000]), encoding="utf-8")
  with pytest.raises(tokenization.TokenizerError) as e:
    tokenization.load_tokenizer(str(tok_dir), _table(30522))
  msg = str(e.value)
  assert "\n" not in msg and repr(str(tok_dir)) in msg and "(vocab.txt)" in msg
  for part in ("knows 20000 tokens", "30522 rows", "10522 rows have no token",
               "the 305 that padding may leave", "tokenizer_dir"):
    assert part in msg


@pytest.mark.unit
@pytest.mark.parametrize("tokens,rows", [(30522, 30528), (30522, 30592), (1000, 1024)])
def test_embedding_table_padded_to_a_multiple_of_64_or_128_is_accepted(tmp_path, tokens, rows):
  tok_dir = _minilm_tokenizer_copy(tmp_path, "tokenizer_config.json", "vocab.txt",
                                   "special_tokens_map.json")
  lines = (tok_dir / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
  (tok_dir / "vocab.txt").write_text("".join(lines[:tokens]), encoding="utf-8")
  assert len(tokenization.load_tokenizer(str(tok_dir), _table(rows))) == tokens
  with pytest.raises(tokenization.TokenizerError, match=f"knows {tokens} tokens"):
    tokenization.load_tokenizer(str(tok_dir), _table(rows + 2 * rows // 100 + 2))


@pytest.mark.unit
def test_invalid_tokenizer_json_that_disagrees_with_vocab_txt_names_the_first_token(tmp_path):
  tok_dir = _minilm_tokenizer_copy(tmp_path)
  assert len(tokenization.load_tokenizer(str(tok_dir), _table(30522))) == 30522  # Agree.
  spec = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
  vocab = spec["model"]["vocab"]
  assert (vocab["the"], vocab["of"]) == (1996, 1997)
  vocab["the"], vocab["of"] = 1997, 1996
  (tok_dir / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
  with pytest.raises(tokenization.TokenizerError) as e:
    tokenization.load_tokenizer(str(tok_dir), _table(30522))
  msg = str(e.value)
  assert "\n" not in msg and repr(str(tok_dir)) in msg
  assert ("tokenizer.json and vocab.txt" in msg and "disagree on 2 token ids, first 'the': "
          "id 1997 in tokenizer.json, id 1996 in vocab.txt" in msg)


@pytest.mark.unit
def test_invalid_added_token_on_a_vocab_txt_id_is_refused_one_past_it_is_not(tmp_path):
  tok_dir = _minilm_tokenizer_copy(tmp_path)
  spec = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
  added = dict(spec["added_tokens"][0], content="[NEW]", id=30522)
  spec["added_tokens"].append(added)
  (tok_dir / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
  tokenization.check_vocab_files_agree(str(tok_dir))  # An addition past the vocabulary.
  added["id"] = 5
  (tok_dir / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
  with pytest.raises(tokenization.TokenizerError,
                     match=r"first '\[NEW\]': id 5 in tokenizer.json, absent in vocab.txt "
                     r"\(which vocab.txt gives to '\[unused4\]'\)"):
    tokenization.load_tokenizer(str(tok_dir), _table(30522))


@pytest.mark.unit
def test_invalid_tokenizer_json_that_disagrees_with_vocab_json(tmp_path):
  tok_dir = _minilm_tokenizer_copy(tmp_path, "tokenizer.json")
  vocab = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
  (tok_dir / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
  tokenization.check_vocab_files_agree(str(tok_dir))
  vocab["fox"] = vocab.pop("##s")  # A vocabulary whose 'fox' is where tokenizer.json has '##s'.
  (tok_dir / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
  with pytest.raises(tokenization.TokenizerError,
                     match=r"vocab.json in .* disagree on 2 token ids, first '##s': id 2015 in "
                     r"tokenizer.json, absent in vocab.json \(which vocab.json gives to 'fox'\);"):
    tokenization.check_vocab_files_agree(str(tok_dir))
