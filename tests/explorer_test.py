"""The attention explorer: packing, and the page in a real headless browser.

The browser tests open the page of a tiny real run (MiniLM, SST-2, L=32, with
the effective and mixing stages) and of a large synthetic workdir (24 layers x
16 heads, L=128) in Chromium via Playwright, and skip when no Chromium is
installed. Screenshots go to $PAPA_ARTIFACTS (default: the test's tmp_path).
"""

import base64
import dataclasses
import importlib.util
import json
import os
import re
import time
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import papa_jax as pj
from configs import base
from papa_jax import attention, convert, explorer, head_maps, run
from papa_jax.config import schema as config_schema
from papa_jax.measures import rank_agreement
from papa_jax import data as data_lib
from papa_jax.measures import effective
from papa_jax.errors import ConfigError
from papa_jax.analysis import mixing_stats
from papa_jax.explorer import ExplorerConfig, chromium, collect, pack, payload, write_explorer
from papa_jax.workdir.layout import Layout
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import init_params
from papa_jax.papa import means as means_lib
from papa_jax.papa import schedule
from tests.testing import tiny_config

CHROMIUM_ARGS = list(chromium.CHROMIUM_ARGS)


# ---- packing (no browser) ----

@pytest.mark.unit
def test_quantize_error_is_within_half_a_step():
  rng = np.random.default_rng(0)
  x = rng.dirichlet(np.ones(20), size=(3, 20))[None]  # [1, 3, 20, 20] rows of probabilities.
  rec = pack.packed_matrices(x)
  assert rec["dtype"] == "uint8" and rec["shape"] == [1, 3, 20, 20]
  back = pack.unpack_matrices(rec)
  step = np.asarray(rec["scales"]).reshape(1, 3, 1, 1)
  assert np.all(np.abs(back - x) <= step / 2 * (1 + 1e-5))
  assert np.allclose(step[..., 0, 0], x.max(axis=(-2, -1)) / 255, rtol=1e-6)

  signed = rng.normal(size=(4, 7, 9))
  rec = pack.packed_matrices(signed)
  assert rec["dtype"] == "int8"
  back, step = pack.unpack_matrices(rec), np.asarray(rec["scales"])[:, None, None]
  assert np.all(np.abs(back - signed) <= step / 2 * (1 + 1e-5))
  assert np.abs(pack.quantize(signed, signed=True)[0]).max() == 127

  zeros = pack.unpack_matrices(pack.packed_matrices(np.zeros((2, 3, 3))))
  assert not zeros.any()
  with pytest.raises(ValueError, match="negative"):
    pack.quantize(signed, signed=False)


@pytest.mark.unit
def test_example_indices_and_config():
  assert collect.example_indices((5, 1), 4, 10) == [5, 1, 0, 2]
  assert collect.example_indices((5, 1), -1, 10) == [5, 1]
  assert collect.example_indices((), 3, 2) == [0, 1]
  with pytest.raises(ValueError, match="outside"):
    collect.example_indices((10,), 4, 10)
  with pytest.raises(ValueError, match="max_examples"):
    collect.example_indices((0, 1, 2), 2, 10)
  c = ExplorerConfig.from_config(base.get_config().explore)
  assert c == ExplorerConfig()
  assert isinstance(c.examples, tuple)


@pytest.mark.unit
def test_explore_log_names_the_model_the_page_runs():
  from papa_jax.explorer import page  # pylint: disable=import-outside-toplevel
  note = page.model_note("sentence-transformers/all-MiniLM-L6-v2", "fetch:splade_tiny")
  assert note == ("examples run through the workdir's model 'splade_tiny' (fetch:splade_tiny); "
                  "the command line's model.name='sentence-transformers/all-MiniLM-L6-v2' is "
                  "not used.")
  assert "not used" not in page.model_note("fetch:splade_tiny", "fetch:splade_tiny")


@pytest.mark.unit
def test_explore_mixing_names_and_the_flag():
  assert tuple(collect.MIXING_LABELS) == config_schema.EXPLORE_MIXING
  assert {n.removesuffix("_rollout") for n in config_schema.EXPLORE_MIXING} <= set(pj.api.MIXING)
  assert ExplorerConfig.from_config(dict(mixing=())).mixing == ()
  assert ExplorerConfig.from_config(dict(mixing=["alti,value_zeroing", "alti"])).mixing == (
      "alti", "value_zeroing")
  with pytest.raises(ConfigError, match="head_norms"):  # Per head: not a per-layer map.
    ExplorerConfig.from_config(dict(mixing=("head_norms",)))
  c = base.get_config()
  c.explore.mixing = ("alti", "rollout")
  with pytest.raises(ConfigError, match="explore.mixing"):
    config_schema.validate(c)
  assert config_schema.quote_name_lists(
      ["--config.explore.mixing=alti,value_zeroing", "--config.explore.mixing="]) == [
          "--config.explore.mixing=('alti','value_zeroing',)", "--config.explore.mixing=()"]
  assert config_schema.quote_name_lists(["--config.explore.figures=svg,png"]) == [
      "--config.explore.figures=('svg','png',)"]


def _dev(config, model, indices):
  dev = data_lib.load_split(config.data, "validation", model.tokenizer(),
                            model.config.type_vocab_size)
  return dev.take(np.asarray(indices))


def assert_mixing_equal(got: np.ndarray, want: np.ndarray, scales):
  """Decoded `[layers, n, n]` maps within half an 8-bit step (per layer) of `want`."""
  step = np.asarray(scales, np.float64).reshape(-1, 1, 1)
  assert got.shape == want.shape
  assert np.all(np.abs(got - want) <= step / 2 * (1 + 1e-5) + 1e-5)
  np.testing.assert_allclose(step[:, 0, 0], want.max((-2, -1)) / 255, rtol=1e-4, atol=1e-9)


@pytest.mark.integration
def test_collected_mixing_maps_equal_context_mixing(tmp_path, minilm):
  """Every layer's map of the real tokens, against `pj.context_mixing` run here one
  example at a time (nothing of it lies on pad rows or columns)."""
  c = tiny_config(tmp_path)
  names = ExplorerConfig.mixing + ("value_zeroing_rollout", "attn")
  records = collect.example_records(minilm, c.data, (4, 1), 3, names)
  sub = _dev(c, minilm, [4, 1, 0])
  want = pj.context_mixing(minilm, sub, batch_size=1)
  assert [r["index"] for r in records] == [4, 1, 0]
  for b, rec in enumerate(records):
    pos = np.flatnonzero(sub.attention_mask[b])
    assert rec["positions"] == pos.tolist() and len(pos) < 32
    assert list(rec["mixing"]) == list(names)
    for name in names:
      full = np.asarray(want[name][b], np.float64)  # [layers, L, L]
      real = full[:, pos][:, :, pos]
      assert np.abs(full).sum() > 0
      assert np.abs(real).sum() == pytest.approx(np.abs(full).sum(), rel=1e-6)
      assert_mixing_equal(pack.unpack_matrices(rec["mixing"][name]), real,
                          rec["mixing"][name]["scales"])


@pytest.mark.integration
def test_mixing_flag_off_runs_no_mixing(tmp_path, minilm, monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("context_mixing ran with explore.mixing=()")
  monkeypatch.setattr(collect.api, "context_mixing", refuse)
  records = collect.example_records(minilm, tiny_config(tmp_path).data, (2,), 1, ())
  assert len(records) == 1 and records[0]["mixing"] == {}


# ---- browser ----

find_chromium = chromium.find_chromium


@pytest.fixture(scope="module")
def browser():
  try:
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
  except ImportError:
    pytest.skip("playwright not installed: pip install -e '.[test]'")
  exe = find_chromium()
  if exe is None:
    pytest.skip("No Chromium found (apt-get install chromium, or set PAPA_CHROMIUM to its "
                "path): the explorer's browser tests need one.")
  with sync_playwright() as p:
    b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
    yield b
    b.close()


class Page:
  """A loaded explorer page and the errors it reported."""

  def __init__(self, browser, path: str, timeout_s: float = 60.0):
    self.errors: list[str] = []
    self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
    self.page.on("console",
                 lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
    self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
    # Long main-thread tasks from the very start (a frozen page shows as one).
    self.page.add_init_script(
        "window.__longTasks = []; new PerformanceObserver((l) => l.getEntries().forEach("
        "(e) => window.__longTasks.push(e.duration))).observe({type: 'longtask', buffered: true});")
    t0 = time.perf_counter()
    self.page.goto("file://" + os.path.abspath(path))
    self.page.wait_for_function(
        "document.body.dataset.ready === '1' || !document.getElementById('error').hidden",
        timeout=timeout_s * 1000)
    self.wall_s = time.perf_counter() - t0
    assert not self.errors, self.errors
    assert self.page.locator("#error").is_hidden(), self.page.locator("#error").inner_text()

  def js(self, expr: str, arg=None):
    return self.page.evaluate(expr, arg)

  def marked(self) -> set[tuple[int, int]]:
    return {tuple(map(int, x)) for x in self.js(
        "[...document.querySelectorAll('.rank-cell.static')]"
        ".map(c => [c.dataset.layer, c.dataset.head])")}


def artifacts_dir(tmp_path) -> str:
  d = os.environ.get("PAPA_ARTIFACTS") or str(tmp_path)
  os.makedirs(d, exist_ok=True)
  return d


TOKEN_PAIRS = (["[CLS]", "a", "good→bad", "film", "[SEP]"], ["[CLS]", "fun→dull", "!", "[SEP]"])


def write_token_maps(wd: str) -> None:
  """A per-position record as the patching stage writes it (random values, 6 layers), so the
  page's per-position panel has something to list."""
  rng = np.random.default_rng(3)
  head_maps.write(Layout(wd), "patching", [], dict(pairs=2), token_maps=[head_maps.TokenMap(
      "patching", "exact_residual_in", "exact change of log p(clean class)",
      tuple(f"layer {l}" for l in range(6)),
      tuple(dict(title=f"pair {i} (swapped): text", tokens=t,
                 values=rng.normal(size=(6, len(t)))) for i, t in enumerate(TOKEN_PAIRS)),
      "nats")])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm):
  """A tiny real run (means, sort, probes, effective and mixing stats) and its explorer page."""
  tmp = tmp_path_factory.mktemp("explorer")
  wd = str(tmp / "wd")
  fast = {"probe.epochs": 1, "probe.cache_features": True, "probe.encoder_dropout": False}
  c = tiny_config(tmp, **fast)
  t0 = time.perf_counter()
  run.run(c, wd)
  t1 = time.perf_counter()
  run.run(tiny_config(tmp, stage="effective", **{"effective.max_examples": 16}, **fast), wd)
  run.run(tiny_config(tmp, stage="mixing", **{"effective.max_examples": 16,
                                              "mixing.methods": ("norms",)}, **fast), wd)
  write_token_maps(wd)
  t2 = time.perf_counter()
  path = write_explorer(wd, examples=(0, 1, 2), max_examples=5, model=minilm)
  print(f"tiny run {t1 - t0:.0f} s, effective and mixing {t2 - t1:.0f} s, explorer "
        f"{time.perf_counter() - t2:.0f} s")
  return dict(wd=wd, path=path, config=c)


@pytest.fixture(scope="module")
def tiny_page(browser, tiny):
  page = Page(browser, tiny["path"])
  yield page
  page.page.close()


@pytest.mark.slow
def test_page_renders_every_view_without_errors(tiny_page, tiny, tmp_path, capsys):
  p = tiny_page
  with capsys.disabled():
    print(f"\n[explorer 6x12, L=32, 5 examples] {os.path.getsize(tiny['path']) / 1e6:.2f} MB, "
          f"first full render {p.js('papaExplorer.loadMs') / 1000:.2f} s in the browser")
  assert p.page.locator("#grid canvas.cell").count() == 6 * 12
  assert p.page.locator(".rank-cell").count() == 6 * 12
  assert p.page.locator(".stat-cell").count() == 6 * 12
  assert p.page.locator(".example-item").count() == 5
  rows = json.load(open(os.path.join(tiny["wd"], "results.json")))["rows"]
  assert p.page.locator("#curve circle.pt").count() == len({r["fraction"] for r in rows})
  assert "L = 32" in p.page.locator("#meta").inner_text()
  assert "max/510" in p.page.locator("#notes").inner_text()
  # Example 0 is no longer than a head (32): its effective panel is its input-dependent one,
  # drawn on the same scale (the same pixels) and level with it.
  assert p.js("papaExplorer.data.examples[0].effective") is None
  panels = ["ex-dynamic", "ex-constant", "ex-effective"]
  pixels = p.page.evaluate("ids => ids.map(i => document.getElementById(i).toDataURL())", panels)
  assert pixels[0] == pixels[2] != pixels[1]
  bottoms = p.page.evaluate(
      "ids => ids.map(i => document.getElementById(i).getBoundingClientRect().bottom)", panels)
  assert max(bottoms) - min(bottoms) < 1, bottoms
  p.page.screenshot(path=os.path.join(artifacts_dir(tmp_path), "explorer_tiny.png"), full_page=True)
  assert not p.errors, p.errors


@pytest.mark.slow
def test_clicking_a_cell_changes_the_large_view(tiny_page):
  p = tiny_page
  before = p.js("document.getElementById('big').toDataURL()")
  p.page.locator('#grid canvas.cell[data-layer="3"][data-head="7"]').click()
  assert p.js("document.getElementById('big').toDataURL()") != before
  assert p.page.locator("#big-title").inner_text().startswith("Layer 3, head 7")
  assert "selected" in p.page.locator(
      '#grid canvas.cell[data-layer="3"][data-head="7"]').get_attribute("class").split()
  assert p.js("[papaExplorer.state.layer, papaExplorer.state.head]") == [3, 7]
  assert not p.errors, p.errors


@pytest.mark.slow
def test_slider_marks_the_scheduled_heads_constant(tiny_page, tiny):
  p = tiny_page
  ranking = json.load(open(os.path.join(tiny["wd"], "sort", "sorted_heads.json")))
  counts = schedule.static_head_counts(72, tiny["config"].papa.fractions)
  assert p.js("papaExplorer.data.meta.counts") == counts == [0, 36, 72]
  seen = []
  for i, k in enumerate(counts):
    p.page.locator("#k-slider").fill(str(i))
    marked = p.marked()
    assert marked == {tuple(h) for h in ranking[:k]}
    assert f"{k} of 72 heads constant" in p.page.locator("#k-label").inner_text()
    seen.append(marked)
  assert seen[0] != seen[1] != seen[2]
  assert not p.errors, p.errors


@pytest.mark.slow
def test_search_filters_the_examples(tiny_page):
  p = tiny_page
  items = p.page.locator(".example-item")
  texts = p.js("papaExplorer.data.examples.map(x => x.text)")
  word = max(texts[1].split(), key=len)
  p.page.locator("#search").fill(word)
  visible = [i for i in range(items.count()) if items.nth(i).is_visible()]
  assert 1 in visible and len(visible) == sum(word.lower() in t.lower() for t in texts) < 5
  p.page.locator("#search").fill("zzqqxx no such text")
  assert not any(items.nth(i).is_visible() for i in range(items.count()))
  p.page.locator("#search").fill("")
  assert all(items.nth(i).is_visible() for i in range(items.count()))
  items.nth(2).click()
  assert p.js("papaExplorer.state.example") == 2
  index = p.js("papaExplorer.data.examples[2].index")
  assert f"#{index}" in p.page.locator("#ex-title").inner_text()
  assert not p.errors, p.errors


@pytest.mark.slow
def test_page_numbers_come_from_the_workdir(tiny_page, tiny, minilm):
  p, wd = tiny_page, tiny["wd"]
  avgs = means_lib.load_means(os.path.join(wd, "means", "means_raw.npz")).avgs
  scales = np.asarray(p.js("papaExplorer.data.means.raw.scales")).reshape(6, 12)
  for l, h in ((0, 0), (3, 7), (5, 11)):
    shown = np.asarray(p.js("([l, h]) => papaExplorer.constant('raw', l, h)", [l, h]))
    shown = shown.reshape(32, 32)
    assert np.abs(shown - avgs[l, h]).max() <= scales[l, h] / 2 * (1 + 1e-5) + 1e-9
    assert scales[l, h] == pytest.approx(avgs[l, h].max() / 255, rel=1e-6)
  ranking = p.js("papaExplorer.data.ranking")
  assert ranking["order"] == json.load(open(os.path.join(wd, "sort", "sorted_heads.json")))
  np.testing.assert_allclose(ranking["lambdas"], np.load(os.path.join(wd, "sort", "lambdas.npy")),
                             rtol=1e-6)

  # One example and head against the model run here, independently of the page.
  dev = data_lib.load_split(tiny["config"].data, "validation", minilm.tokenizer(),
                            minilm.config.type_vocab_size)
  e, (l, h) = 1, (4, 3)
  index = p.js(f"papaExplorer.data.examples[{e}].index")
  ids, mask, tt = (jnp.asarray(a[index][None]) for a in
                   (dev.input_ids, dev.attention_mask, dev.token_type_ids))
  out = minilm.apply(ids, mask, token_type_ids=tt, capture_attention=True, capture_values=True)
  pos = np.flatnonzero(dev.attention_mask[index])
  n = len(pos)
  assert p.js(f"papaExplorer.data.examples[{e}].positions") == pos.tolist()
  want = np.asarray(out.attentions[l])[0, h][np.ix_(pos, pos)]
  shown = np.asarray(p.js(f"papaExplorer.dynamic({e}, {l}, {h})")).reshape(n, n)
  step = p.js(f"papaExplorer.data.examples[{e}].dynamic.scales[{l * 12 + h}]")
  assert np.abs(shown - want).max() <= step / 2 * (1 + 1e-5) + 1e-6

  key_mask = jnp.broadcast_to(mask[:, None, :] > 0, out.attentions[l].shape[:-1])
  eff = np.asarray(effective.effective_attention(out.attentions[l], out.values[l], key_mask)[0])
  want_eff = eff[0, h][np.ix_(pos, pos)]
  shown = np.asarray(p.js(f"papaExplorer.effective({e}, {l}, {h})")).reshape(n, n)
  # n <= head dim 32 at L=32: A_eff = A, stored once as the dynamic block.
  assert n <= 32 and p.js(f"papaExplorer.data.examples[{e}].effective") is None
  assert np.abs(shown - want_eff).max() <= step / 2 * (1 + 1e-5) + 2e-5

  # The constant masked to the example, against attention.constant_probs.
  want = np.asarray(attention.constant_probs(jnp.asarray(avgs[l]), mask))[0, h][np.ix_(pos, pos)]
  shown = np.asarray(p.js(f"papaExplorer.maskedConstant('raw', {e}, {l}, {h})")).reshape(n, n)
  eps = scales[l, h] / 2 * (1 + 1e-5)
  kept = np.abs(avgs[l, h][np.ix_(pos, pos)]).sum(1, keepdims=True)
  bound = eps * (1 + n * want) / (kept - n * eps)  # The page's stated bound.
  assert np.all(np.abs(shown - want) <= bound + 1e-6)
  assert not p.errors, p.errors


@pytest.mark.slow
def test_page_warns_about_the_model_only_when_it_differs(browser, tiny, tmp_path):
  """The workdir's own page, opened as a new user would (the model loaded from its
  config), shows no model warning; a page with another model's examples shows it, in red."""
  pytest.importorskip("sre_embedding_model")
  warning = "not the one the means were computed with"
  own = Page(browser, write_explorer(tiny["wd"], examples=(0,), max_examples=1,
                                     path=str(tmp_path / "own.html")))
  assert not [w for w in own.js("papaExplorer.data.meta.warnings") if warning in w]
  assert own.page.locator(".warn", has_text=warning).count() == 0
  other = convert.load_pretrained("pkg:sre_embedding_model/model_weights")
  page = Page(browser, write_explorer(tiny["wd"], examples=(0,), max_examples=1, model=other,
                                      path=str(tmp_path / "other.html")))
  shown = page.page.locator(".warn", has_text=warning)
  assert shown.count() == 1 and shown.first.is_visible()
  assert shown.first.evaluate("e => getComputedStyle(e).color") == "rgb(170, 51, 51)"
  own.page.close()
  page.page.close()


@pytest.mark.slow
def test_mixing_selector_shows_each_measure_with_its_label(tiny_page, tiny, minilm):
  """The per-example context-mixing panel: one option per `explore.mixing` map, each
  drawing its own map with its description, numbers equal to `pj.context_mixing`."""
  p, names, e, l = tiny_page, list(ExplorerConfig.mixing), 2, 3
  assert p.js("[...document.querySelectorAll('#mix-method option')].map(o => o.value)") == names
  assert p.js("papaExplorer.data.meta.mixing_maps") == [[n, collect.MIXING_LABELS[n]]
                                                         for n in names]
  assert p.page.locator("#ex-mixing").is_visible() and p.page.locator("#mix-method").is_visible()
  p.page.locator(".example-item").nth(e).click()
  p.page.locator("#ex-layer").select_option(str(l))
  drawn = set()
  for name in names:
    p.page.locator("#mix-method").select_option(name)
    assert collect.MIXING_LABELS[name] in p.page.locator("#mix-note").inner_text()
    title = p.page.locator("#ex-mixing-title").inner_text()
    assert title.startswith(f"{collect.MIXING_LABELS[name].split(':')[0]}, layer {l} (all heads)")
    drawn.add(p.js("document.getElementById('ex-mixing').toDataURL()"))
  assert len(drawn) == len(names)
  before = p.js("document.getElementById('lines').toDataURL()")
  p.page.locator("#line-source").select_option("mixing")
  assert p.js("document.getElementById('lines').toDataURL()") != before
  p.page.locator("#line-source").select_option("dynamic")

  index = p.js(f"papaExplorer.data.examples[{e}].index")
  sub = _dev(tiny["config"], minilm, [index])
  want = pj.context_mixing(minilm, sub, batch_size=1)
  pos = np.flatnonzero(sub.attention_mask[0])
  for name in names:
    real = np.asarray(want[name][0], np.float64)[:, pos][:, :, pos]
    shown = np.stack([np.asarray(p.js(f"papaExplorer.mixing({e}, '{name}', {k})"))
                      for k in range(6)]).reshape(real.shape)
    assert_mixing_equal(shown, real, p.js(f"papaExplorer.data.examples[{e}].mixing.{name}.scales"))
  assert not p.errors, p.errors


@pytest.mark.slow
def test_head_grid_offers_every_per_head_result(tiny_page, tiny):
  """The per-head grid lists every per-head result of the workdir by itself (the effective
  and mixing stages' maps, PAPA's gates), each drawn from its file, with its Spearman rho
  against the gates from the workdir's one agreement table."""
  p = tiny_page
  st = json.load(open(os.path.join(tiny["wd"], "mixing", "stats.json")))
  gates = np.load(os.path.join(tiny["wd"], "sort", "lambdas.npy"))
  labels = {k: v.label for k, v in mixing_stats.Mixing.infos.items()}
  subsets = p.js("[...document.querySelectorAll('#stat-subset option')].map(o => o.value)")
  assert subsets == ["effective/all", "effective/long", "mixing", "sort"]
  assert p.page.locator("#stat-subset option[value=mixing]").inner_text() == (
      f"mixing ({st['summary']['examples']} validation examples)")
  p.page.locator("#stat-subset").select_option("mixing")
  options = p.js("[...document.querySelectorAll('#stat-map option')].map(o => o.value)")
  assert sorted(options) == sorted(labels.values())  # In the order of stats.json.
  grids = set()
  for key, (l, h) in (("norm_mass", (4, 3)), ("head_share", (0, 11))):
    p.page.locator("#stat-map").select_option(labels[key])
    assert p.page.locator(".stat-cell").count() == 6 * 12
    grids.add(p.page.locator("#stat-map-grid").inner_html())
    p.page.locator(f'.stat-cell[data-layer="{l}"][data-head="{h}"]').hover()
    assert p.page.locator("#tip").inner_text() == (
        f"layer {l}, head {h}: {labels[key]} = {st[key][l][h]:.4f}")
    shown = p.js(f"papaExplorer.data.heads.maps.find(m => m.key === 'mixing/{key}').values")
    np.testing.assert_allclose(shown, st[key])
    rho = rank_agreement.head_rank_agreement(np.asarray(st[key]), gates)["rho"]
    assert f"Spearman ρ over heads with sort/lambda {rho:.2f}" in p.page.locator(
        "#stat-summary").inner_text()
  assert len(grids) == 2
  p.page.locator("#stat-subset").select_option("sort")
  assert p.page.locator("#stat-summary").inner_text().startswith(
      "sort/lambda. Higher = more important.")
  p.page.locator("#stat-subset").select_option("effective/all")  # The effective stage's maps.
  assert p.js("document.getElementById('stat-map').value") not in labels.values()
  assert not p.errors, p.errors


@pytest.mark.slow
def test_per_position_results_are_listed_by_themselves(tiny_page, tiny, tmp_path):
  """A stage's per-position record (here the patching stage's shape) is listed with no page
  code of its own: each example drawn as layers x its word pieces, centred at 0, the hover
  value read from the stage's stats.json."""
  p = tiny_page
  st = json.load(open(os.path.join(tiny["wd"], "patching", "stats.json")))
  want = st["token_maps"][0]
  assert p.js("[...document.querySelectorAll('#tok-map option')].map(o => o.text)") == [
      "patching: exact_residual_in"]
  assert p.js("document.querySelectorAll('#tok-example option').length") == 2
  sizes = []
  for i, toks in enumerate(TOKEN_PAIRS):
    p.page.locator("#tok-example").select_option(str(i))
    assert p.page.locator("#tok-title").inner_text() == (
        f"exact change of log p(clean class): pair {i} (swapped): text")
    p.page.locator("#tok-canvas").scroll_into_view_if_needed()
    box = p.page.locator("#tok-canvas").bounding_box()
    sizes.append(box["width"])
    (tx, ty, sx, sy), _ = matrix_cells(ET.fromstring(p.js(
        "papaExplorer.exportPanel('token-map', 'svg')").encode()))[0]
    vals = np.asarray(want["examples"][i]["values"])
    p.page.mouse.move(box["x"] + tx + 1.5 * sx, box["y"] + ty + 3.5 * sy)  # Token 1, layer 3.
    assert p.page.locator("#tip").inner_text() == (
        f"layer 3, {toks[1]} (position 1): {vals[3, 1]:.4f} nats")
    peak = np.abs(vals).max()
    bar = p.page.locator("#tok-bar").inner_text().split()
    assert float(bar[0]) == pytest.approx(-peak, abs=1e-3)
    assert float(bar[-1]) == pytest.approx(peak, abs=1e-3)
  assert sizes[0] != sizes[1]  # Five word pieces, then four.
  p.page.locator("#tok-example").select_option("0")
  assert "patching/exact_residual_in. Unit: nats. Rows: 6; 2 examples" in p.page.locator(
      "#tok-summary").inner_text()
  p.page.locator("#sec-tokens").screenshot(path=os.path.join(artifacts_dir(tmp_path),
                                                             "explorer_positions.png"))
  assert not p.errors, p.errors


SVG_NS = "{http://www.w3.org/2000/svg}"
PANELS = ["grid", "big", "rank-map", "curve", "lines", "stat-map-grid", "token-map", "ex-dynamic",
          "ex-constant", "ex-effective", "ex-mixing"]


def png_bytes(data_url: str) -> bytes:
  head, _, b64 = data_url.partition(",")
  assert head == "data:image/png;base64", head[:40]
  raw = base64.b64decode(b64)
  assert raw[:8] == b"\x89PNG\r\n\x1a\n"
  return raw


def png_size(raw: bytes) -> tuple[int, int]:
  """(width, height) from the PNG's IHDR chunk."""
  return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def matrix_cells(root) -> list[tuple[tuple[float, float, float, float], dict]]:
  """Each `<g class="matrix">`: (translate x, y, scale x, y), in the coordinates of the
  drawing it is on (its canvas's CSS pixels), and {(row, col): fill}."""
  out = []
  for g in root.iter(f"{SVG_NS}g"):
    if g.get("class") != "matrix":
      continue
    t = re.fullmatch(r"translate\(([-\d.]+) ([-\d.]+)\) scale\(([-\d.]+) ([-\d.]+)\)",
                     g.get("transform"))
    cells = {(int(r.get("y")), int(r.get("x"))): r.get("fill") for r in g.iter(f"{SVG_NS}rect")}
    out.append((tuple(map(float, t.groups())), cells))
  return out


@pytest.mark.slow
def test_every_panel_exports_as_svg_and_png(tiny_page, tiny, browser, tmp_path, capsys):
  """Each panel's SVG is real vector: one <rect> a matrix cell, coloured as the canvas pixel
  under it, text as <text>; its PNG is twice the figure's CSS size; the buttons download
  files named after the model, the panel and the selection. A grid over 512 x 512 cells in
  all falls back to embedded images, and says so."""
  p = tiny_page
  p.js("papaExplorer.select(3, 7)")
  p.page.locator(".example-item").nth(1).click()
  p.page.locator("#mix-method").select_option("attention_rollout")
  assert p.js("papaExplorer.panels") == PANELS
  assert p.page.locator(".export[data-panel] button.export-btn").count() == 2 * len(PANELS)
  assert p.js("[...document.querySelectorAll('.export button')].every(b => !b.disabled)")
  index, tokens = p.js("(x => [x.index, x.tokens])(papaExplorer.data.examples[1])")
  n, dpr = len(tokens), p.js("window.devicePixelRatio")
  scale = max(2, dpr)
  sizes, seconds = {}, {}
  for panel in PANELS:
    t0 = time.perf_counter()
    text = p.js("id => papaExplorer.exportPanel(id, 'svg')", panel)
    t1 = time.perf_counter()
    raw = png_bytes(p.js("id => papaExplorer.exportPanel(id, 'png')", panel))
    seconds[panel] = (t1 - t0, time.perf_counter() - t1)
    sizes[panel] = (len(text), len(raw))
    assert "<image" not in text and "<foreignObject" not in text, panel  # Vector, no raster.
    root = ET.fromstring(text.encode())
    w, h = p.js("id => papaExplorer.panelSize(id)", panel)
    assert root.tag == f"{SVG_NS}svg" and (float(root.get("width")), float(root.get("height"))) \
        == (w, h), panel
    assert png_size(raw) == (round(w * scale), round(h * scale)), panel
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert any("minilm" in (t or "") for t in texts), panel  # The title, as text.
    cells = matrix_cells(root)
    if panel in ("big", "ex-dynamic", "ex-constant", "ex-effective", "ex-mixing", "lines"):
      canvas = panel if panel.startswith("ex-") or panel == "lines" else "big"
      cw = p.js(f"document.getElementById('{canvas}').getBoundingClientRect().width")
      assert w >= cw, panel  # The canvas at 1:1 CSS pixels, within the figure.
    if panel == "grid":
      assert len(cells) == 72 and all(len(c) == 32 * 32 for _, c in cells)
    elif panel in ("big", "ex-dynamic", "ex-constant", "ex-effective", "ex-mixing"):
      size = 32 if panel == "big" else n
      assert len(cells) == 1 and len(cells[0][1]) == size * size, panel
      (tx, ty, sx, sy), fills = cells[0]
      i, j = (5, 9) if panel == "big" else (n // 2, n // 3)  # Off the landmark lines.
      x, y = tx + (j + 0.5) * sx, ty + (i + 0.5) * sy  # In the canvas's CSS pixels.
      pixel = p.js(f"document.getElementById('{canvas}').getContext('2d')"
                   f".getImageData({int(x * dpr)}, {int(y * dpr)}, 1, 1).data.slice(0, 3)")
      pixel = [pixel[str(k)] if isinstance(pixel, dict) else pixel[k] for k in range(3)]
      assert fills[(i, j)] == "#%02x%02x%02x" % tuple(pixel), (panel, i, j)
      assert tokens[0] in texts or panel == "big", panel  # Word pieces label the axes.
    elif panel in ("rank-map", "stat-map-grid"):
      rects = [r for r in root.iter(f"{SVG_NS}rect") if r.get("class") == "cell"]
      assert len(rects) == 72, panel
      cls = "rank-cell" if panel == "rank-map" else "stat-cell"
      dom = p.js(f"getComputedStyle(document.querySelector('.{cls}[data-layer=\"2\"]"
                 f"[data-head=\"5\"]')).backgroundColor")
      rgb = tuple(int(v) for v in re.findall(r"\d+", dom)[:3])
      assert rects[2 * 12 + 5].get("fill") == "#%02x%02x%02x" % rgb, panel
    elif panel == "curve":
      assert len(list(root.iter(f"{SVG_NS}circle"))) == p.page.locator("#curve circle.pt").count()
      assert any("fraction of heads" in (t or "") for t in texts)
    elif panel == "lines":
      assert len(list(root.iter(f"{SVG_NS}line"))) > n and tokens[1] in texts
    elif panel == "token-map":  # Layers x the pair's word pieces, coloured as the canvas.
      toks = TOKEN_PAIRS[0]
      assert len(cells) == 1 and len(cells[0][1]) == 6 * len(toks), panel
      assert all(t in texts for t in toks) and "layer 5" in texts
      (tx, ty, sx, sy), fills = cells[0]
      x, y = tx + 2.5 * sx, ty + 4.5 * sy  # Token 2, layer 4.
      pixel = p.js(f"document.getElementById('tok-canvas').getContext('2d')"
                   f".getImageData({int(x * dpr)}, {int(y * dpr)}, 1, 1).data.slice(0, 3)")
      pixel = [pixel[str(k)] if isinstance(pixel, dict) else pixel[k] for k in range(3)]
      assert fills[(4, 2)] == "#%02x%02x%02x" % tuple(pixel)
  # Effective = input-dependent for this example: the same cells, the same colours.
  assert p.js("papaExplorer.data.examples[1].effective") is None
  same = [matrix_cells(ET.fromstring(p.js("id => papaExplorer.exportPanel(id, 'svg')", k)
                                     .encode()))[0][1] for k in ("ex-dynamic", "ex-effective")]
  assert same[0] == same[1]

  names = {}
  for panel, fmt in (("ex-dynamic", "svg"), ("curve", "png"), ("grid", "svg")):
    button = p.page.locator(f'.export[data-panel="{panel}"] button[data-format="{fmt}"]')
    with p.page.expect_download() as info:
      button.click()
    names[panel] = info.value.suggested_filename
    path = str(tmp_path / names[panel])
    info.value.save_as(path)
    if fmt == "svg":
      assert ET.parse(path).getroot().tag == f"{SVG_NS}svg"
    else:
      with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert names == {"ex-dynamic": f"minilm_sst2_ex{index}_layer3_head7_dynamic.svg",
                   "curve": "minilm_sst2_papa-curve.png", "grid": "minilm_sst2_constant_raw.svg"}
  assert p.js("papaExplorer.exportName('ex-mixing', 'png')") == (
      f"minilm_sst2_ex{index}_layer3_attention-rollout.png")  # "_" only between parts.
  p.js("papaExplorer.select(0, 0)")
  p.page.locator(".example-item").nth(0).click()
  assert not p.errors, p.errors
  with capsys.disabled():
    print("\n[export 6x12, L=32] " + ", ".join(
        f"{k} svg {s / 1e3:.0f} kB {seconds[k][0]:.2f} s, png {q / 1e3:.0f} kB "
        f"{seconds[k][1]:.2f} s" for k, (s, q) in sizes.items()))

  # A larger grid: 24 heads at L=128 is over 512 x 512 cells, so its matrices are images.
  wd = str(tmp_path / "big")
  synthetic_workdir(wd, json.loads(tiny["config"].data.to_json()), 4, 6, 128)
  big = Page(browser, write_explorer(wd, examples=(), max_examples=-1))
  text = big.js("papaExplorer.exportPanel('grid', 'svg')")
  root = ET.fromstring(text.encode())
  images = [e for e in root.iter(f"{SVG_NS}image") if e.get("class") == "matrix"]
  assert len(images) == 24 and not matrix_cells(root)
  assert "each matrix is an embedded PNG" in text
  assert len(matrix_cells(ET.fromstring(big.js("papaExplorer.exportPanel('big', 'svg')")
                                        .encode()))[0][1]) == 128 * 128
  assert big.page.locator('.export[data-panel="ex-dynamic"] button[disabled]').count() == 2
  big.page.close()
  assert not big.errors, big.errors


@pytest.mark.slow
def test_mixing_maps_off_by_flag_or_for_a_bfloat16_model(browser, tiny, tmp_path, minilm,
                                                          monkeypatch):
  """`explore.mixing=()` (through the launcher's entry point) stores no maps and the page
  hides the selector; a bfloat16 model skips them with a warning instead of failing."""
  def refuse(*args, **kwargs):
    raise AssertionError("context_mixing ran")
  monkeypatch.setattr(collect.api, "context_mixing", refuse)
  c = tiny_config(tmp_path, stage="explore", **{"explore.mixing": (), "explore.examples": (0,),
                                                "explore.max_examples": 1,
                                                "explore.output": "off.html"})
  p = Page(browser, explorer.run(c, tiny["wd"]))
  assert p.js("papaExplorer.data.meta.mixing_maps") == []
  assert p.js("papaExplorer.data.examples[0].mixing") == {}
  assert p.page.locator("#mix-method").is_hidden() and p.page.locator("#ex-mixing").is_hidden()
  assert "mixing" not in p.js("[...document.querySelectorAll('#line-source option')]"
                              ".map(o => o.value)")
  assert "No context-mixing maps stored" in p.page.locator("#mix-note").inner_text()
  assert p.page.locator("#ex-dynamic").is_visible() and not p.errors, p.errors
  p.page.close()
  half = convert.Pretrained(dataclasses.replace(minilm.config, compute_dtype="bfloat16"),
                            minilm.params, minilm.model_dir)
  data = payload(tiny["wd"], examples=(0,), max_examples=1, model=half)
  assert data["meta"]["mixing_maps"] == [] and data["examples"][0]["mixing"] == {}
  assert any("need a float32 model" in w for w in data["meta"]["warnings"])


# ---- a large model ----

def synthetic_workdir(wd: str, data_cfg: dict, layers: int, heads: int, L: int, seed: int = 0):
  """Random means and ranking of the given shape, and results rows with intervals."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(wd, "means"))
  logits = rng.normal(scale=2.0, size=(layers, heads, L, L))
  avgs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  meta = dict(format=means_lib.FORMAT, model="random", task=data_cfg["task"], split="train",
              max_length=L, num_examples=1000, attention="raw", papa_layout=True)
  np.savez(os.path.join(wd, "means", "means_raw.npz"), avgs=avgs.astype(np.float32),
           sums=avgs, counts=np.ones((L, L)), metadata=np.asarray(json.dumps(meta)))
  schedule.save_ranking(Layout(wd), rng.normal(size=(layers, heads)))
  total, fractions = layers * heads, list(schedule.PAPER_FRACTIONS)
  rows = []
  for variant in ("raw", "effective"):
    for f, k in zip(fractions, schedule.static_head_counts(total, fractions)):
      if k == 0 and variant != "raw":
        continue
      score = 0.9 - 0.3 * f ** 3 + (0.01 if variant == "effective" else 0.0)
      rows.append(dict(variant=variant, static_heads=k, total_heads=total, fraction=k / total,
                       metric="accuracy", score=score, score_std=0.01,
                       band_low=score - 0.02, band_high=score + 0.015))
  with open(os.path.join(wd, "results.json"), "w") as f:
    json.dump(dict(rows=rows), f)
  with open(os.path.join(wd, "config.json"), "w") as f:
    json.dump(dict(model=dict(name="random-24x16"), data=dict(data_cfg, max_length=L),
                   papa=dict(fractions=fractions)), f)
  return avgs


def random_params(config: EncoderConfig, seed: int):
  """Random weights of `config`'s shapes (much faster than a 24-layer eager init)."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(lambda: init_params(config))

  def leaf(path, s):
    name = jax.tree_util.keystr(path)
    if name.endswith("['scale']"):  # LayerNorm: identity, or activations vanish.
      return jnp.ones(s.shape, s.dtype)
    return jnp.asarray(rng.normal(scale=0.05, size=s.shape), s.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


@pytest.mark.slow
def test_large_model_page_stays_responsive(browser, tiny, tmp_path, minilm, capsys):
  L, layers, heads = 128, 24, 16
  cfg = EncoderConfig(vocab_size=minilm.config.vocab_size, hidden_size=64,
                      num_layers=layers, num_heads=heads, intermediate_size=128,
                      max_position_embeddings=512)
  model = convert.Pretrained(cfg, random_params(cfg, seed=1), minilm.model_dir)
  wd = str(tmp_path / "large")
  data_cfg = json.loads(tiny["config"].data.to_json())  # Its prepared TFDS data too.
  avgs = synthetic_workdir(wd, data_cfg, layers, heads, L)
  # Two cheap mixing maps: value zeroing's 24 layers would add ~30 s of compilation here.
  path = write_explorer(wd, examples=(0, 1), max_examples=-1, model=model,
                        mixing=("attention_rollout", "alti"))
  size_mb = os.path.getsize(path) / 1e6

  p = Page(browser, path, timeout_s=120)
  # Head dim 4 < n: effective attention differs from the dynamic one and is stored.
  data_cfg = ml_collections.ConfigDict(dict(data_cfg, max_length=L))
  dev = data_lib.load_split(data_cfg, "validation", minilm.tokenizer(), 2).take(np.array([0]))
  out = model.apply(jnp.asarray(dev.input_ids), jnp.asarray(dev.attention_mask),
                    token_type_ids=jnp.asarray(dev.token_type_ids), capture_attention=True,
                    capture_values=True)
  a, v = out.attentions[-1], out.values[-1]
  key_mask = jnp.broadcast_to(jnp.asarray(dev.attention_mask, bool)[:, None, :], a.shape[:-1])
  pos = np.flatnonzero(dev.attention_mask[0])
  want = np.asarray(effective.effective_attention(a, v, key_mask)[0])[0, 5][np.ix_(pos, pos)]
  shown = np.asarray(p.js(f"papaExplorer.effective(0, {layers - 1}, 5)")).reshape(len(pos), -1)
  step = p.js(f"papaExplorer.data.examples[0].effective.scales[{(layers - 1) * heads + 5}]")
  assert np.abs(shown - want).max() <= step / 2 * (1 + 1e-5) + 1e-6
  assert np.abs(want - np.asarray(a)[0, 5][np.ix_(pos, pos)]).max() > 10 * step
  load_ms, longest = p.js("papaExplorer.loadMs"), max(p.js("window.__longTasks") or [0])
  assert p.page.locator("#grid canvas.cell").count() == layers * heads
  assert p.page.locator("#curve .band").count() == 2
  assert p.page.locator("#curve .errbar").count() > 5
  # Each legend entry is drawn in its curve's colour, and the two differ.
  style = "es => es.map(e => getComputedStyle(e).{})"
  fills = p.page.locator("#curve text.legend").evaluate_all(style.format("fill"))
  strokes = p.page.locator("#curve polyline.curve-line").evaluate_all(style.format("stroke"))
  assert fills == strokes and len(set(fills)) == 2, (fills, strokes)
  # No per-head stage ran: the per-head grid lists PAPA's gates alone, on every head.
  assert p.js("[...document.querySelectorAll('#stat-subset option')].map(o => o.value)") == [
      "sort"]
  assert p.page.locator(".stat-cell").count() == 24 * 16
  assert p.js("papaExplorer.data.meta.mixing_maps.map(m => m[0])") == ["attention_rollout", "alti"]
  p.page.locator('#grid canvas.cell[data-layer="23"][data-head="15"]').click()
  assert p.js("[papaExplorer.state.layer, papaExplorer.state.head]") == [23, 15]
  shown = np.asarray(p.js("papaExplorer.constant('raw', 23, 15)")).reshape(L, L)
  assert np.abs(shown - avgs[23, 15]).max() <= avgs[23, 15].max() / 510 * (1 + 1e-5)
  p.page.locator("#k-slider").fill("2")
  assert len(p.marked()) == schedule.static_head_counts(layers * heads, schedule.PAPER_FRACTIONS)[2]
  p.page.screenshot(path=os.path.join(artifacts_dir(tmp_path), "explorer_24x16.png"))
  assert not p.errors, p.errors
  with capsys.disabled():
    print(f"\n[explorer 24x16, L={L}, 2 examples] {size_mb:.2f} MB, first full render "
          f"{load_ms / 1000:.2f} s in the browser ({p.wall_s:.2f} s wall), longest "
          f"main-thread task {longest:.0f} ms")
  # Not frozen: drawing is chunked, so no single task blocks the page for long.
  assert longest < 5000, f"a {longest:.0f} ms task froze the page"


@pytest.mark.slow
def test_page_shows_every_head_ordering_side_by_side(browser, tiny, tmp_path):
  """A workdir with other head orderings (papa.orderings): one map per ordering, each
  framing its own first k heads at the slider's step, with its Spearman correlation."""
  import scipy.stats
  layers, heads, L = 4, 6, 16
  wd = str(tmp_path / "orders")
  data_cfg = json.loads(tiny["config"].data.to_json())
  synthetic_workdir(wd, data_cfg, layers, heads, L)
  lam = json.load(open(os.path.join(wd, "sort", "sorted_heads.json")))
  orders = {"entropy": lam[::-1], "random_0": lam[5:] + lam[:5]}
  os.makedirs(os.path.join(wd, "orderings"))
  for name, order in orders.items():
    with open(os.path.join(wd, "orderings", f"{name}.json"), "w") as f:
      json.dump(dict(ordering=name, ranking=order, direction="ascending", scores=None), f)
  p = Page(browser, write_explorer(wd, examples=(), max_examples=-1))
  captions = p.page.locator("#rank-compare figcaption").all_inner_texts()
  assert [c.split(",")[0] for c in captions] == ["lambda", "entropy", "random_0"]
  assert "Spearman with λ -1.00" in captions[1]
  rho = scipy.stats.spearmanr(np.arange(24), [lam.index(x) for x in orders["random_0"]])[0]
  assert f"Spearman with λ {rho:.2f}" in captions[2]
  p.page.locator("#k-slider").fill("1")  # Half the heads.
  for name, order in [("lambda", lam)] + list(orders.items()):
    framed = {tuple(map(int, x)) for x in p.js(
        f"[...document.querySelectorAll('[data-ordering=\"{name}\"] .rank-mini.static')]"
        ".map(c => [c.dataset.layer, c.dataset.head])")}
    assert framed == {tuple(x) for x in order[:12]}, name
  assert not p.errors, p.errors


@pytest.mark.slow
def test_docs_figures_script_redraws_them_naming_the_commit(browser, tiny, tmp_path):
  """docs/make_figures.py redraws the quickstart's figures from a workdir: the explorer shot
  full-page at 1400 px and the PAPA curve, each with the commit in a footer and its metadata."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      "make_figures", os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs",
                                   "make_figures.py"))
  make_figures = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(make_figures)
  written = make_figures.main(["--quickstart", tiny["wd"], "--out", str(tmp_path)], browser)
  assert sorted(os.path.basename(p) for p in written) == ["explorer.png",
                                                          "quickstart_papa_curve.png"]
  rev = make_figures.commit()
  for path in written:
    with Image.open(path) as im:
      source = im.info["Source"]
      assert source.startswith(f"papa-jax {rev} · minilm · sst2 · 48 train / 32 dev"), source
      if path.endswith("explorer.png"):
        assert im.size[0] == 1400 and im.size[1] > 2000, im.size
