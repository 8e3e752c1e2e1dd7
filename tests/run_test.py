"""The pipeline end to end on a tiny real config, and its fail-fast checks."""

import json
import os
import shutil

import numpy as np
import pytest

from papa_jax import run
from papa_jax.probing import features
from papa_jax.workdir import rules as workdir
from papa_jax.data import DataError
from papa_jax.papa import means as means_lib
from tests.testing import require_shared, tiny_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory, minilm):
  del minilm  # Skip cleanly when the packaged model is missing.
  tmp = tmp_path_factory.mktemp("e2e")
  wd = str(tmp / "wd")
  rows = run.run(tiny_config(tmp), wd)
  return tmp, wd, rows


@pytest.mark.slow
def test_run_end_to_end_writes_readable_results(finished):
  _, wd, rows = finished
  assert [r["static_heads"] for r in rows] == [0, 36, 72]
  for name in ("results.json", "results.csv", "results.md", "papa_curve.png", "config.json",
               "means/means_raw.npz", "sort/sorted_heads.json", "sort/lambdas.npy"):
    assert os.path.exists(os.path.join(wd, name)), name
  res = json.load(open(os.path.join(wd, "results.json")))
  assert res["seeds"] == [42] and "jax" in res["versions"] and "config" in res
  assert {r["static_heads"] for r in res["rows"]} == {0, 36, 72}
  assert res["summary"][0]["baseline"] == rows[0]["score"]
  assert all(0.0 <= r["score"] <= 1.0 and r["examples"] == 48 for r in res["rows"])
  # Each probe names the code that trained it (results.json names its last writer).
  assert {r["git_revision"] for r in res["rows"]} == {workdir.git_revision()} != {None}
  means = means_lib.load_means(os.path.join(wd, "means", "means_raw.npz"))
  assert means.metadata["num_examples"] == 48 and means.avgs.shape == (6, 12, 32, 32)
  ranking = json.load(open(os.path.join(wd, "sort", "sorted_heads.json")))
  lam = np.load(os.path.join(wd, "sort", "lambdas.npy"))
  assert sorted(map(tuple, ranking)) == [(l, h) for l in range(6) for h in range(12)]
  assert lam.reshape(-1)[ranking[0][0] * 12 + ranking[0][1]] == lam.min()
  assert "| raw | 36/72 |" in open(os.path.join(wd, "results.md")).read()


@pytest.mark.slow
def test_run_results_load_back_through_the_api(finished):
  import papa_jax as pj
  _, wd, rows = finished
  res = pj.load_results(wd)
  assert [r["score"] for r in res["rows"]] == [r["score"] for r in rows]
  assert res["means"]["raw"].avgs.shape == (6, 12, 32, 32)
  assert len(res["ranking"]) == 72 and res["lambdas"].shape == (6, 12)
  pred = np.load(os.path.join(wd, "probe", "raw_k0_s42", "predictions.npz"))
  assert pred["predictions"].shape == pred["labels"].shape == (32,)
  acc = float((pred["predictions"] == pred["labels"]).mean())
  assert acc == pytest.approx(rows[0]["score"])  # The saved predictions give the score.


@pytest.mark.slow
def test_run_rerun_reuses_finished_work(finished):
  tmp, wd, rows = finished
  again = run.run(tiny_config(tmp), wd)
  assert [r["score"] for r in again] == [r["score"] for r in rows]
  assert [r["seconds"] for r in again] == [r["seconds"] for r in rows]  # Loaded, not re-run.


@pytest.mark.slow
def test_invalid_workdir_of_another_config_is_refused(finished):
  tmp, wd, _ = finished
  with pytest.raises(run.ConfigError, match=r"different config.*probe.learning_rate"):
    run.run(tiny_config(tmp, **{"probe.learning_rate": 1e-3}), wd)


@pytest.mark.slow
def test_run_extending_fractions_reuses_finished_runs(finished, tmp_path):
  tmp, wd, rows = finished
  other = str(tmp_path / "wd_more")
  shutil.copytree(wd, other)
  more = run.run(tiny_config(tmp, **{"papa.fractions": (0.0, 0.5, 0.875, 1.0)}), other)
  assert [r["static_heads"] for r in more] == [0, 36, 63, 72]
  done = {r["static_heads"]: r["seconds"] for r in rows}
  assert all(r["seconds"] == done[r["static_heads"]] for r in more if r["static_heads"] in done)


@pytest.mark.slow
def test_invalid_max_length_differs_from_saved_means(finished, tmp_path):
  tmp, wd, _ = finished
  other = tmp_path / "wd2"
  shutil.copytree(os.path.join(wd, "means"), other / "means")
  with pytest.raises(means_lib.MeansFileError, match="max_length=32, but this run uses max_length=16"):
    run.run(tiny_config(tmp, **{"data.max_length": 16, "stage": "probe"}), str(other))


@pytest.mark.slow
def test_invalid_means_from_another_model(finished, tmp_path):
  import importlib.util
  spec = importlib.util.find_spec("sre_embedding_model")
  if spec is None:
    pytest.skip("sre-embedding-model not installed")
  tmp, wd, _ = finished
  other = tmp_path / "wd3"
  shutil.copytree(os.path.join(wd, "means"), other / "means")
  model_dir = os.path.join(list(spec.submodule_search_locations)[0], "model_weights")
  with pytest.raises(means_lib.MeansFileError, match="another model"):
    run.run(tiny_config(tmp, **{"model.name": model_dir, "stage": "probe"}), str(other))


@pytest.mark.unit
def test_invalid_unknown_task_and_missing_data_fail_fast(tmp_path):
  with pytest.raises(ValueError, match="Unknown task 'sst5'"):
    run.run(tiny_config(tmp_path, **{"data.task": "sst5"}), str(tmp_path / "a"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(DataError, match=r"lacks 'train.tsv'"):
    run.run(tiny_config(tmp_path, **{"data.data_dir": str(tmp_path / "empty")}),
            str(tmp_path / "b"))


@pytest.mark.unit
def test_invalid_config_values_fail_fast(tmp_path):
  with pytest.raises(run.ConfigError, match="needs a deterministic encoder"):
    run.run(tiny_config(tmp_path, **{"probe.cache_features": True}), str(tmp_path / "c"))
  with pytest.raises(run.ConfigError, match="stage="):
    run.run(tiny_config(tmp_path, stage="everything"), str(tmp_path / "d"))
  with pytest.raises(run.ConfigError, match="papa.variants"):
    run.run(tiny_config(tmp_path, **{"papa.variants": ("raw", "fancy")}), str(tmp_path / "e"))
  with pytest.raises(run.ConfigError, match="report.seed_pairing='both'"):
    run.run(tiny_config(tmp_path, **{"report.seed_pairing": "both"}), str(tmp_path / "f"))


@pytest.mark.integration
def test_invalid_cache_budget_fails_before_any_stage_runs(tmp_path, minilm):
  """A model whose cached features exceed run.cache_max_gb is refused before the means
  pass and the sorting run (not hours later, at the probe stage)."""
  del minilm
  c = tiny_config(tmp_path, **{"probe.cache_features": True, "probe.encoder_dropout": False,
                               "run.cache_max_gb": 0.001})
  with pytest.raises(features.CacheTooLarge, match=r"80 examples needs 0.03 GiB, over the "
                     r"budget run.cache_max_gb=0.001"):
    run.run(c, str(tmp_path / "f"))
  assert not os.path.exists(tmp_path / "f" / "means")


@pytest.mark.slow
def test_run_end_to_end_ner_token_tagging(tmp_path, minilm):
  del minilm
  c = tiny_config(tmp_path, **{"data.task": "ner", "data.max_length": 24,
                               "papa.fractions": (0.0, 1.0), "probe.epochs": 1})
  c.data.data_dir = str(require_shared("data", "conll2003"))
  rows = run.run(c, str(tmp_path / "ner"))
  assert [r["static_heads"] for r in rows] == [0, 72]
  assert rows[0]["metric"] == "f1" and set(rows[0]["scores"]) == {"f1", "precision", "recall", "accuracy"}
  assert not os.path.exists(tmp_path / "ner" / "sort" / "sorted_heads.json")  # Not needed.


@pytest.mark.slow
def test_run_failed_on_a_data_error_then_fixed_runs_in_the_same_workdir(tmp_path, minilm):
  del minilm
  bad = tmp_path / "bad"
  bad.mkdir()
  good = require_shared("data", "sst2")
  (bad / "dev.tsv").write_bytes(open(good / "dev.tsv", "rb").read())
  (bad / "train.tsv").write_text("sentence\tlabel\na fine movie \t1\na bad one \tmaybe\n")
  wd = tmp_path / "wd"
  with pytest.raises(DataError, match="maybe"):
    run.run(tiny_config(tmp_path, **{"data.data_dir": str(bad), "stage": "means"}), str(wd))
  assert not (wd / "config.json").exists()  # Nothing written before the data was checked.
  run.run(tiny_config(tmp_path, **{"stage": "means"}), str(wd))
  assert (wd / "means" / "means_raw.npz").exists()


@pytest.mark.unit
def test_invalid_workdir_is_an_existing_file(tmp_path):
  path = tmp_path / "file"
  path.write_text("x")
  with pytest.raises(run.ConfigError, match="exists and is not a directory"):
    run.run(tiny_config(tmp_path), str(path))


@pytest.mark.slow
def test_overwrite_replaces_means_that_a_reuse_check_would_refuse(tmp_path, minilm):
  del minilm
  wd = str(tmp_path / "wd")
  run.run(tiny_config(tmp_path, stage="means"), wd)
  with pytest.raises(run.ConfigError, match="different config.*data.max_length"):
    run.run(tiny_config(tmp_path, stage="means", **{"data.max_length": 16}), wd)
  run.run(tiny_config(tmp_path, stage="means", overwrite=True, **{"data.max_length": 16}), wd)
  assert means_lib.load_means(os.path.join(wd, "means", "means_raw.npz")).avgs.shape[-1] == 16
