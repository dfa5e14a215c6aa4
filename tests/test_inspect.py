"""`entropy-rft inspect`: the page-building logic (steps, colour scales, names, safe embedding), the trainer's
samples of two real runs (terms summing to the logged prediction), and the page itself in headless Chromium
(Debian's package, `make chromium`): no console error and no request, token elements, clipped tokens and the values
shown on hover and keyboard focus checked against the runs' samples files, and a screenshot."""

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from cdp import Browser, find_chromium

from entropy_rft import samples
from entropy_rft.commands import inspect_page
from entropy_rft.config import load_config
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train

# two methods on the same seed: the same rollouts at step 1; Clip_B at mu 0.5 clips tokens in negative samples
RUN = dict(
    steps=2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    eval_problems=2,
    eval_k=1,
    lr=1e-4,
    progress=False,
    samples_every=1,
    samples_groups=0,
    probe_every=0,
)
NASTY = ["</script><script>window.hacked=1</script>", "<!--", "é", "line\nbreak", "", "&amp;", " ", "\u2028"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """grpo and clip_b (mu 0.5) trained for 2 steps, every group of every step written."""
    root = tmp_path_factory.mktemp("inspect")
    dirs = [root / "grpo", root / "clip_b"]
    train(load_config(None, method="grpo", out=str(dirs[0]), **RUN))
    train(load_config(None, method="clip_b", mu=0.5, out=str(dirs[1]), **RUN))
    return dirs


def crafted_run(root: Path) -> Path:
    """A run directory holding one record whose prompt and tokens are markup, a comment opener, a line break,
    an empty continuation token and a line separator: the page must show them as text."""
    from test_samples import ListTokenizer, random_batch

    batch = random_batch(groups=1, group_size=2, width=len(NASTY), seed=4)
    batch["response_mask"][:] = True
    batch["response_ids"] = torch.arange(len(NASTY)).repeat(2, 1)
    batch["prompt_ids"], batch["prompt_mask"] = torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool)
    rec = samples.build_record(
        samples.SampleBatch(tokenizer=ListTokenizer(NASTY), step_size=1e-3, **batch),
        step=1,
        groups=0,
        info={"method": "crafted"},
    )
    samples.write_record(root / "crafted", rec)
    return root / "crafted"


# ---------------------------------------------------------------------------------------------------------------
# Page-building logic


def test_colour_scale_is_the_quantile_of_magnitudes():
    """colour_scale is the nearest-rank 98th percentile of |v| (a sort), ignores None and NaN, falls back to the
    largest |v| when that percentile is 0, and is 0 with no non-zero value."""
    values = [(-1) ** i * i for i in range(1, 101)] + [None, float("nan")]
    assert inspect_page.colour_scale(values) == sorted(abs(v) for v in values[:100])[97] == 98
    assert inspect_page.colour_scale([0.0] * 99 + [-3.0]) == 3.0
    assert inspect_page.colour_scale([None, 0.0]) == 0.0


def test_pick_steps_thins_evenly_and_keeps_the_ends():
    """All steps when they fit; otherwise max_steps evenly spaced ones with the first and last; asked-for steps
    must exist (the error lists the sampled ones)."""
    available = [1] + list(range(10, 1001, 10))
    assert inspect_page.pick_steps(available[:5]) == available[:5]
    thin = inspect_page.pick_steps(available, max_steps=11)
    assert len(thin) == 11 and thin[0] == 1 and thin[-1] == 1000 and thin == sorted(thin)
    assert inspect_page.pick_steps(available, [20, 10]) == [10, 20]
    with pytest.raises(ValueError, match="no samples at step 15; sampled steps: 1, 10"):
        inspect_page.pick_steps(available, [15])


def test_a_page_over_the_data_budget_shows_fewer_steps(tmp_path, monkeypatch):
    """When the chosen steps' data pass MAX_DATA_BYTES, the page keeps about the share that fits, first and last
    step included; asked-for steps (--steps) are all kept."""
    from test_samples import ListTokenizer, random_batch

    batch = random_batch()
    for step in range(1, 11):
        samples.write_record(
            tmp_path / "run",
            samples.build_record(
                samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=1e-3, **batch), step=step, groups=0
            ),
        )
    one = len(json.dumps(samples.read_samples(tmp_path / "run")[1]))
    monkeypatch.setattr(inspect_page, "MAX_DATA_BYTES", int(3.5 * one))
    page = inspect_page.build_page([tmp_path / "run"], tmp_path / "p.html").read_text()
    assert '"steps":[1,5,10]' in page  # 3 of 10 steps fit: the first, the middle, the last
    page = inspect_page.build_page([tmp_path / "run"], tmp_path / "p.html", steps=[2, 3, 4, 5]).read_text()
    assert '"steps":[2,3,4,5]' in page


def test_run_names_are_distinct():
    """Runs in different parents with one directory name get their parent names too."""
    names = inspect_page.run_names([Path("/a/x/grpo"), Path("/a/y/grpo"), Path("/a/y/clip_b")])
    assert names == ["x/grpo", "y/grpo", "y/clip_b"]


def test_embedded_data_cannot_close_its_script(tmp_path):
    """Prompts and tokens holding '</script>', '<!--' and '&' are embedded as \\u escapes: the page holds exactly
    its two closing script tags, and the embedded text parses back to the same data."""
    page = inspect_page.build_page([crafted_run(tmp_path)], tmp_path / "p.html").read_text()
    assert page.count("</script") == 2 and "<!--" not in page
    embedded = re.search(r'<script type="application/json" id="samples-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(embedded)
    assert data["runs"][0]["steps"]["1"]["groups"][0]["responses"][0]["text"] == NASTY


def test_inspect_without_samples_names_the_fix(tmp_path, capsys):
    """A run directory with no samples fails with the setting that writes them."""
    from entropy_rft.commands.cli import main

    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit):
        main(["inspect", str(tmp_path / "run")])
    assert "samples_every" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# The trainer's samples


@pytest.mark.slow
def test_trainer_terms_sum_to_the_logged_prediction(runs):
    """Every group written: each step's file holds every valid token once; the terms sum to eq. 23's total, and that
    plus the recorded lr/|T_B| E[A] E[S_c] is the step's logged entropy_change/predicted (Corollary 4). The
    prediction is a float32 covariance over ~100 tokens (relative error about n eps32 = 1e-5 of its terms' size);
    stored numbers carry 7 digits: tolerance 1e-4 of sum |term|."""
    for run in runs:
        metrics = read_metrics(run)
        recs = samples.read_samples(run)
        assert sorted(recs) == [1, 2]
        for step, rec in recs.items():
            row = metrics[step - 1]
            tokens = [resp for g in rec["groups"] for resp in g["responses"]]
            assert len(tokens) == rec["batch"]["responses"] == RUN["prompts_per_step"] * RUN["group_size"]
            assert sum(len(r["text"]) for r in tokens) == rec["batch"]["valid_tokens"]
            terms = [t for r in tokens for t in r["term"]]
            size = sum(abs(t) for t in terms)
            ec = rec["entropy_change"]
            assert sum(terms) == pytest.approx(ec["eq23"], abs=1e-6 * size)
            assert ec["eq23"] + ec["dropped_term"] == pytest.approx(row["entropy_change/predicted"], abs=1e-4 * size)
            assert rec["metrics"]["entropy_change/predicted"] == pytest.approx(
                row["entropy_change/predicted"], rel=1e-6
            )
            assert rec["batch"]["entropy"] == pytest.approx(row["entropy"], rel=1e-6)
            # the prediction by region, from the written tokens: each kept token's term plus its share of the
            # dropped term (step A E_T[S_c] / |T|), added to its region (A's sign x S* > 0)
            shift = ec["step_size"] * ec["mean_s_centered"] / ec["tokens_in_mean"]
            regions = dict.fromkeys(("pos_likely", "pos_unlikely", "neg_likely", "neg_unlikely"), 0.0)
            for r in tokens:
                for term, kept, s_star in zip(r["term"], r["kept"], r["s_star"]):
                    if kept and r["advantage"] != 0:
                        side = "pos" if r["advantage"] > 0 else "neg"
                        regions[side + ("_likely" if s_star > 0 else "_unlikely")] += term + shift * r["advantage"]
            for name, value in regions.items():
                key = f"entropy_change/by_region/{name}"
                assert rec["metrics"][key] == pytest.approx(row[key], rel=1e-6, abs=1e-12)
                assert value == pytest.approx(row[key], abs=1e-4 * size)
            clipped = sum(k == 0 for r in tokens for k in r["kept"])
            assert clipped / rec["batch"]["valid_tokens"] == pytest.approx(row["clip_frac"], rel=1e-6)
    grpo, clip_b = (samples.read_samples(r)[1] for r in runs)
    assert grpo["batch"]["kept_tokens"] == grpo["batch"]["valid_tokens"]  # GRPO clips nothing
    assert clip_b["batch"]["kept_tokens"] < clip_b["batch"]["valid_tokens"]
    same = lambda rec: [r["text"] for g in rec["groups"] for r in g["responses"]]  # noqa: E731
    assert same(grpo) == same(clip_b)  # one seed: the same rollouts at step 1


@pytest.mark.slow
def test_resume_cuts_the_samples_after_its_checkpoint(runs, tmp_path):
    """A run resumed from its checkpoint (step 2, trained on to step 3) first removes the samples of later steps and
    a half-written file that a killed run left; the samples of steps up to the checkpoint stay as they were, and
    step 3 is written anew."""
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    kept = {p.name: p.read_bytes() for p in (run / "samples").iterdir()}
    assert sorted(kept) == [samples.file_name(1), samples.file_name(2)]
    stale = b"a step the resumed run has not reached"
    (run / "samples" / samples.file_name(3)).write_bytes(stale)
    (run / "samples" / ".step-000004.json.gz.99.tmp").write_bytes(b"half")
    train(load_config(None, method="grpo", out=str(run), **{**RUN, "steps": 3}), resume=True)
    now = {p.name: p.read_bytes() for p in (run / "samples").iterdir()}
    assert sorted(now) == [samples.file_name(s) for s in (1, 2, 3)]
    assert {k: now[k] for k in kept} == kept and now[samples.file_name(3)] != stale
    assert samples.read_samples(run)[3]["step"] == 3


# ---------------------------------------------------------------------------------------------------------------
# The page in a real browser


def _close(shown: str, want: float | None) -> bool:
    """Whether a number the page shows (4 significant digits, maybe a leading '+') is the stored value."""
    if want is None:
        return shown == "\u2014"
    return math.isclose(float(shown.replace("\u2212", "-")), want, rel_tol=1e-3, abs_tol=1e-300)


def _token_places(rec: dict) -> tuple[int, set]:
    """(number of written tokens, the (group, response, position) of the clipped ones) of a record."""
    n, clipped = 0, set()
    for k, g in enumerate(rec["groups"]):
        for j, resp in enumerate(g["responses"]):
            n += len(resp["text"])
            clipped |= {(k, j, t) for t, kept in enumerate(resp["kept"]) if not kept}
    return n, clipped


def _tab_to_token(page) -> None:
    """Press Tab from the top of the page until a token has keyboard focus (at most 200 presses)."""
    for _ in range(200):
        page.key("Tab")
        if page.evaluate("document.activeElement.classList.contains('tok')"):
            return
    pytest.fail("Tab never reached a token")


def _check_dom(page, records: list[dict | None]) -> None:
    for r, rec in enumerate(records):
        n, clipped = _token_places(rec)
        assert page.evaluate(f"document.querySelectorAll('.tok[data-run=\"{r}\"]').length") == n
        got = page.evaluate(
            f"Array.from(document.querySelectorAll('.tok.clipped[data-run=\"{r}\"]'))"
            ".map(e => [+e.dataset.group, +e.dataset.resp, +e.dataset.pos])"
        )
        assert {tuple(x) for x in got} == clipped


def _check_details(page, rec: dict, k: int, j: int, t: int) -> None:
    """The details panel shows the stored values of token (k, j, t)."""
    fields = page.evaluate(
        "Object.fromEntries(Array.from(document.querySelectorAll('#details dd'))"
        ".map(e => [e.dataset.field, e.textContent]))"
    )
    resp = rec["groups"][k]["responses"][j]
    for name in ("logp", "entropy", "s_star", "s_centered"):
        assert _close(fields[name], resp[name][t]), (name, fields[name], resp[name][t])
    assert _close(fields["p"], math.exp(resp["logp"][t]))
    assert _close(fields["advantage"], resp["advantage"])
    assert _close(fields["reward"], resp["reward"])
    a, s_star = resp["advantage"], resp["s_star"][t]  # the region: A's sign x S* > 0 (likely) or <= 0 (unlikely)
    want = "none" if a == 0 else ("A+" if a > 0 else "A\u2212") + (" likely" if s_star > 0 else " unlikely")
    assert fields["region"].startswith(want), (fields["region"], a, s_star)
    if resp["kept"][t]:
        assert fields["kept"] == "kept" and _close(fields["term"], resp["term"][t])
    else:
        would = -resp["term_scale"] * resp["advantage"] * resp["s_centered"][t]
        assert fields["kept"].startswith("clipped")
        shown = re.search(r"would have been (\S+)\)", fields["term"]).group(1)
        assert fields["term"].startswith("0, clipped") and _close(shown, would)


@pytest.mark.slow
def test_page_in_chromium(runs, tmp_path):
    """Headless Chromium loads the page of grpo, clip_b and a crafted run from disk: no console error, no request but
    the page itself. For step 1, then step 2 chosen with the keyboard: one token element per written token of each
    run's file, the clipped ones exactly the file's. Tab reaches a token, the arrow key moves to the next, and the
    panel shows that token's stored values; hovering a clipped token shows it clipped with its would-be term. The
    statistic selector recolours by H. A screenshot is written (ENTROPY_RFT_SCREENSHOT: also copied there)."""
    if find_chromium() is None:
        why = "no chromium on PATH: `make chromium` installs Debian's (apt-get install chromium)"
        if os.environ.get("CI"):  # CI installs it first (.ci/run): a missing browser there is a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    dirs = [*runs, crafted_run(tmp_path)]
    out = inspect_page.build_page(dirs, tmp_path / "inspect.html")
    recs = [samples.read_samples(d) for d in dirs]
    with Browser(find_chromium()) as browser:
        page = browser.open(out.resolve().as_uri())
        page.wait_for("document.body.dataset.ready === '1'")
        assert page.evaluate("window.hacked === undefined")  # the crafted '</script><script>' stayed text
        _check_dom(page, [rec.get(1) for rec in recs])
        assert page.evaluate('document.querySelector(\'.tok[data-run="2"][data-pos="0"]\').textContent') == NASTY[0]

        # keyboard: Tab from the top of the page until a token has focus, then one to the right
        _tab_to_token(page)
        index = (
            '(e => Array.from(document.querySelectorAll(`.tok[data-run="${e.dataset.run}"]`)).indexOf(e))'
            "(document.activeElement)"
        )
        before = page.evaluate(index)
        page.key("ArrowRight")
        assert page.evaluate(index) == before + 1
        where = page.evaluate(
            "(e => [+e.dataset.run, +e.dataset.group, +e.dataset.resp, +e.dataset.pos])(document.activeElement)"
        )
        r, k, j, t = where
        assert page.evaluate("document.activeElement.classList.contains('tok')")
        _check_details(page, recs[r][1], k, j, t)

        # hover: the first clipped token of clip_b
        k, j, t = min(_token_places(recs[1][1])[1])
        page.evaluate(f"document.getElementById('t-1-{k}-{j}-{t}').scrollIntoView({{block: 'center'}})")
        box = page.evaluate(
            f"(r => [r.x + r.width / 2, r.y + r.height / 2])(document.getElementById('t-1-{k}-{j}-{t}')"
            ".getBoundingClientRect())"
        )
        page.hover(*box)
        page.wait_for(f"document.getElementById('t-1-{k}-{j}-{t}').classList.contains('sel')", timeout=5)
        _check_details(page, recs[1][1], k, j, t)
        page.evaluate("window.scrollTo(0, 0)")
        page.hover(1, 1)

        # the statistic selector, by keyboard: term -> H
        page.evaluate("document.getElementById('stat').focus()")
        page.key("ArrowDown")
        assert page.evaluate("document.getElementById('stat').value") == "entropy"
        first = recs[0][1]["groups"][0]["responses"][0]
        assert _close(page.evaluate("document.getElementById('t-0-0-0-0').dataset.v"), first["entropy"][0])
        legend = page.evaluate("document.getElementById('legend').textContent")
        assert "H, entropy" in legend and "regions: A+ / A\u2212" in legend
        page.evaluate("document.getElementById('values').click()")
        shot = page.screenshot(tmp_path / "inspect.png")

        # the step selector, by keyboard: step 1 -> 2 (the crafted run has no step 2)
        page.evaluate("document.getElementById('step').focus()")
        page.key("ArrowDown")
        assert page.evaluate("document.getElementById('step').value") == "2"
        _check_dom(page, [rec.get(2) for rec in recs[:2]])
        assert "No samples at step 2" in page.evaluate("document.querySelector('.run:nth-child(3)').textContent")

        browser.pump(0.2)
        assert page.errors() == []
        assert page.requests() == [out.resolve().as_uri()]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("ENTROPY_RFT_SCREENSHOT"):
        shutil.copy(shot, os.environ["ENTROPY_RFT_SCREENSHOT"])
