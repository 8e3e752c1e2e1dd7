"""Training-loop guarantees: NaN/Inf stops with the step; truncation is counted and logged."""

import logging

import numpy as np
import pytest
from ml_collections import ConfigDict

from papa_jax import data as data_lib
from papa_jax import parallel
from papa_jax.probing import features, fitting, probes, train
from papa_jax.data import pipeline
from papa_jax.models.config import EncoderConfig
from tests.testing import optimizer_config

TINY = EncoderConfig(vocab_size=50, hidden_size=8, num_layers=1, num_heads=2,
                     intermediate_size=8, max_position_embeddings=16)


@pytest.mark.unit
def test_invalid_nonfinite_loss_stops_naming_the_step():
  n, L = 64, 4
  rng = np.random.default_rng(0)
  feats = rng.normal(size=(n, TINY.num_hidden_states, L, 8)).astype(np.float32)
  bad = 37
  feats[bad] = np.inf
  data = features.Features(feats, np.ones((n, L), np.int32),
                           rng.integers(0, 2, n).astype(np.int32))
  order = pipeline.epoch_order(n, shuffle=True, seed=3, epoch=0)
  step = int(np.flatnonzero(order == bad)[0]) // 8 + 1
  with pytest.raises(FloatingPointError, match=rf"at step {step} \(step {step} of epoch 1\)"):
    fitting.fit("nan", probes.SentenceProbe(2, 8, 0.0), train.FrozenEncoder(None, None, TINY),
              train.make_optimizer(optimizer_config()),
              train.FitConfig(epochs=2, batch_size=8, eval_batch_size=8, seed=3,
                              log_every_steps=3),
              data, data, lambda x: {}, parallel.make_mesh(1))


@pytest.mark.integration
def test_long_sequences_are_truncated_and_counted(minilm_tokenizer, sst2_dir, caplog, tmp_path):
  cfg = ConfigDict(dict(task="sst2", source="local", data_dir=str(sst2_dir),
                        max_length=8, papa_layout=False, faithful_segment_ids=True,
                        subsample_seed=0, skip_malformed=False))
  with caplog.at_level(logging.INFO):
    enc = data_lib.load_split(cfg, "validation", minilm_tokenizer, 2, max_examples=50)
  assert enc.input_ids.shape == (50, 8) and enc.truncated > 25
  assert f"{enc.truncated} of 50 examples lost word pieces to max_length=8" in caplog.text


@pytest.mark.unit
def test_fit_logs_an_epoch_line_at_most_every_interval_and_the_last(monkeypatch):
  """Four fast epochs: the first and the last epoch reach the console, the rest go to DEBUG
  (every epoch stays in the history)."""
  n, L = 32, 4
  rng = np.random.default_rng(0)
  data = features.Features(rng.normal(size=(n, TINY.num_hidden_states, L, 8)).astype(np.float32),
                           np.ones((n, L), np.int32), rng.integers(0, 2, n).astype(np.int32))
  info, debug = [], []
  monkeypatch.setattr(fitting.logging, "info", lambda fmt, *a: info.append(fmt % a))
  monkeypatch.setattr(fitting.logging, "debug", lambda fmt, *a: debug.append(fmt % a))
  _, history, _ = fitting.fit(
      "quiet", probes.SentenceProbe(2, 8, 0.0), train.FrozenEncoder(None, None, TINY),
      train.make_optimizer(optimizer_config()),
      train.FitConfig(epochs=4, batch_size=8, eval_batch_size=8, seed=3, log_every_steps=3),
      data, data, lambda x: {}, parallel.make_mesh(1))
  epochs = lambda lines: [l.split("epoch ")[1].split(" ")[0] for l in lines if ": epoch " in l]
  assert epochs(info) == ["1/4", "4/4"] and epochs(debug) == ["2/4", "3/4"]
  assert [h["epoch"] for h in history] == [1, 2, 3, 4]
