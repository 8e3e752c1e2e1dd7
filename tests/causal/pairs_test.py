"""Pair files for patching: CSV, TSV and JSON Lines through the data readers, and the checks
that name the line of a pair that cannot be patched."""

import json

import numpy as np
import pytest

from papa_jax.causal import pairs
from papa_jax.data.errors import DataError

ROWS = [("a gorgeous , witty film", "a dull , witty film", "good"),
        ('it said "yes, again"', 'it said "no, again"', "bad")]


def _write(tmp_path, fmt, rows=ROWS, header=("clean", "corrupt", "target")):
  path = tmp_path / f"pairs.{fmt}"
  if fmt == "jsonl":
    path.write_text("".join(json.dumps(dict(zip(header, r))) + "\n" for r in rows))
  else:
    import csv  # pylint: disable=import-outside-toplevel
    with open(path, "w", newline="", encoding="utf-8") as f:
      w = csv.writer(f, delimiter="," if fmt == "csv" else "\t",
                     quoting=csv.QUOTE_MINIMAL if fmt == "csv" else csv.QUOTE_NONE,
                     escapechar=None if fmt == "csv" else "\\")
      w.writerow(header)
      w.writerows(rows)
  return str(path)


@pytest.mark.unit
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_pairs_read_from_each_format_with_and_without_a_target(tmp_path, fmt):
  path = _write(tmp_path, fmt)
  got = pairs.read_pairs(path, target="target")
  assert [(p.clean, p.corrupt, p.target) for p in got] == ROWS
  assert got[0].line == (2 if fmt == "csv" else 1)
  assert all(p.target is None for p in pairs.read_pairs(path))


@pytest.mark.unit
def test_tsv_pairs_by_column_number_without_a_header(tmp_path):
  path = tmp_path / "p.tsv"
  path.write_text("x\tthe film\tthe movie\n")
  got = pairs.read_pairs(str(path), clean="1", corrupt="2", header=False)
  assert (got[0].clean, got[0].corrupt, got[0].line) == ("the film", "the movie", 1)


@pytest.mark.unit
def test_bad_pair_files_are_named(tmp_path):
  path = _write(tmp_path, "csv", header=("clean", "broken", "target"))
  with pytest.raises(DataError, match=r"pairs.csv:1: header .* lacks columns \['corrupt'\]"):
    pairs.read_pairs(path)
  path = tmp_path / "p.jsonl"
  path.write_text('{"clean": "a", "corrupt": "b"}\n{"clean": "a"\n{"clean": 1, "corrupt": "b"}\n')
  with pytest.raises(DataError, match=r"p.jsonl:2: not valid JSON .*\(2 malformed rows in"):
    pairs.read_pairs(str(path))
  with pytest.raises(DataError, match=r"p.txt: pair files are"):
    pairs.read_pairs(str(tmp_path / "p.txt"))
  empty = tmp_path / "e.csv"
  empty.write_text("clean,corrupt\n")
  with pytest.raises(DataError, match="holds no pairs"):
    pairs.read_pairs(str(empty))


@pytest.mark.integration
def test_encoded_pairs_are_padded_together_and_unequal_or_long_pairs_named(tmp_path,
                                                                           minilm_tokenizer):
  tok = minilm_tokenizer
  path = _write(tmp_path, "csv")
  got = pairs.read_pairs(path, target="target")
  clean, corrupt = pairs.encode_pairs(got, tok, 64, path=path)
  for side, batch in (("clean", clean), ("corrupt", corrupt)):
    for i, p in enumerate(got):
      want = tok(getattr(p, side))["input_ids"]
      n = int(batch["attention_mask"][i].sum())
      assert batch["input_ids"][i, :n].tolist() == want
  np.testing.assert_array_equal(clean["attention_mask"], corrupt["attention_mask"])
  np.testing.assert_array_equal(pairs.token_ids(tok, [p.target for p in got],
                                                [p.line for p in got], path),
                                tok.convert_tokens_to_ids(["good", "bad"]))
  with pytest.raises(DataError, match=r"pairs.csv:2: target 'unwatchably' is \d word pieces"):
    pairs.token_ids(tok, ["good", "unwatchably"], [3, 2], path)
  uneven = [pairs.Pair(5, "a film", "a wonderful film", None)]
  with pytest.raises(DataError, match=r"pairs:5: the clean text has 4 word pieces and the "
                                      r"corrupt 5"):
    pairs.encode_pairs(uneven, tok, 64)
  a, b = pairs.encode_pairs(uneven, tok, 64, equal_lengths=False)
  assert a["attention_mask"].sum() == 4 and b["attention_mask"].sum() == 5
  with pytest.raises(DataError, match=r"pairs.csv:2: the clean text has \d+ word pieces, more "
                                      r"than max_length 4"):
    pairs.encode_pairs(got, tok, 4, path=path)
