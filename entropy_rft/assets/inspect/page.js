// entropy-rft inspect: renders the embedded samples (entropy_rft/samples.py records) of one step for every run.
// No request leaves the page; everything it shows comes from the JSON element #samples-data.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("samples-data").textContent);
  const STATS = DATA.statistics;
  const $ = (id) => document.getElementById(id);
  const state = { step: DATA.steps[0], stat: STATS[0].key, selected: null };
  const NEG = [5, 113, 176], POS = [202, 0, 32], SEQ = [84, 39, 143];

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "\u2014";
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e5 ? v.toPrecision(4) : v.toExponential(3);
  }
  function short(v) { return v === null || v === undefined ? "\u2014" : String(Number(v.toPrecision(4))); }
  function signed(v) { return v === null || v === undefined ? "\u2014" : (v > 0 ? "+" : "") + fmt(v); }
  function statOf(key) { return STATS.find((s) => s.key === key); }
  function scaleOf(step, key) { return (DATA.scales[String(step)] || {})[key] || 0; }

  // background colour of a value: diverging blue / red for signed statistics, one hue for the others (alpha-blended
  // on white, at most 0.7, so black text keeps a contrast ratio above 4.5)
  function colour(v, stat, scale) {
    if (v === null || v === undefined || !(scale > 0)) return "";
    let t, rgb;
    if (stat.signed) { t = Math.max(-1, Math.min(1, v / scale)); rgb = t > 0 ? POS : NEG; t = Math.abs(t) * 0.7; }
    else { t = Math.min(1, Math.abs(v) / scale) * 0.6; rgb = SEQ; }
    return "rgba(" + rgb.join(",") + "," + t.toFixed(3) + ")";
  }

  function tokenValue(resp, pos, key) {
    if (key === "push") {  // -A S_c: the term without the loss's step size, defined for every loss
      const a = advantageAt(resp, pos), s = resp.s_centered[pos];
      return a === null || a === undefined || s === null ? null : -a * s;
    }
    const col = resp[key];
    return col ? col[pos] : null;
  }
  function advantageAt(resp, pos) { return resp.advantage_t ? resp.advantage_t[pos] : resp.advantage; }
  // the per-token marks of a record (what the monitor's filters would drop): [{key, label}]
  function marksOf(rec) { return rec.marks || []; }
  function markedBy(rec, resp, pos) { return marksOf(rec).filter((m) => resp[m.key] && resp[m.key][pos]); }
  function wouldBe(resp, pos) {
    const a = advantageAt(resp, pos), s = resp.s_centered[pos];
    return resp.term_scale === null || a === null || s === null ? null : -resp.term_scale * a * s;
  }
  function shown(text) {
    if (text === "") return "\u00b7";
    return text.replace(/\r/g, "\u240d").replace(/\n/g, "\u21b5\n");
  }

  function tokenHtml(r, k, j, rec, resp, pos, stat, scale) {
    const v = tokenValue(resp, pos, stat.key);
    const clipped = !resp.kept[pos];
    const text = resp.text[pos];
    const marks = marksOf(rec).map((m, i) => (resp[m.key] && resp[m.key][pos] ? " mark-" + i : "")).join("");
    const cls = "tok" + (clipped ? " clipped" : "") + marks + (text === "" ? " cont" : "");
    const notes = (clipped ? ["clipped"] : []).concat(markedBy(rec, resp, pos).map((m) => m.label));
    const label = notes.length ? ' aria-label="' + esc(text + " (" + notes.join("; ") + ")") + '"' : "";
    return '<span class="' + cls + '" tabindex="0" id="t-' + r + "-" + k + "-" + j + "-" + pos + '" data-run="' + r +
      '" data-group="' + k + '" data-resp="' + j + '" data-pos="' + pos + '" data-v="' + esc(fmt(v)) + '"' + label +
      ' style="background:' + colour(v, stat, scale) + '">' + esc(shown(text)) + "</span>";
  }

  function topTable(r, rec, name, caption) {
    const rows = (rec.top || {})[name] || [];
    if (!rows.length) return "";
    let out = '<table class="top"><caption>' + esc(caption) + '</caption><thead><tr><th scope="col">token in context</th>' +
      '<th scope="col">' + (name === "removed" ? "would-be term" : "term") + '</th><th scope="col">A</th>' +
      '<th scope="col">S_c</th><th scope="col"><span class="visually-hidden">go to</span></th></tr></thead><tbody>';
    for (const e of rows) {
      const k = rec.groups.findIndex((g) => g.index === e.group);
      const j = k < 0 ? -1 : rec.groups[k].responses.findIndex((x) => x.row === e.row);
      const here = k >= 0 && j >= 0 && e.position < rec.groups[k].responses[j].text.length;
      const go = here ? '<button type="button" data-goto="t-' + r + "-" + k + "-" + j + "-" + e.position +
        '" aria-label="Show this token in its response">show</button>' : "";
      out += '<tr><td><span class="ctx">' + esc(e.before.slice(-24)) + '</span><span class="hit">' + esc(shown(e.text)) +
        '</span><span class="ctx">' + esc(e.after.slice(0, 12)) + "</span></td><td>" + signed(e.term) + "</td><td>" +
        signed(e.advantage) + "</td><td>" + signed(e.s_centered) + "</td><td>" + go + "</td></tr>";
    }
    return out + "</tbody></table>";
  }

  // the four regions of a step's tokens (dynamics.REGIONS): the sign of A x whether the token is likely (S* > 0)
  const REGIONS = [["pos_likely", "A+ likely"], ["pos_unlikely", "A+ unlikely"], ["neg_likely", "A\u2212 likely"],
    ["neg_unlikely", "A\u2212 unlikely"]];

  function regionOf(a, sStar) {
    if (a === null || a === undefined || a === 0 || sStar === null || sStar === undefined) return "none (A = 0)";
    const name = REGIONS.find(([key]) => key === (a > 0 ? "pos" : "neg") + (sStar > 0 ? "_likely" : "_unlikely"))[1];
    return name + " (A " + (a > 0 ? "> 0" : "< 0") + ", S* " + (sStar > 0 ? "> 0" : "\u2264 0") + ")";
  }

  function summaryHtml(rec) {
    const b = rec.batch, ec = rec.entropy_change || {}, m = rec.metrics || {};
    const clipped = b.valid_tokens - b.kept_tokens;
    let written = 0, writtenTerms = 0, termsKnown = true;
    for (const g of rec.groups) for (const resp of g.responses) {
      written += resp.text.length;
      for (const t of resp.term) { if (t === null) termsKnown = false; else writtenTerms += t; }
    }
    const rows = [
      ["mean H", fmt(b.entropy) + " (all " + b.valid_tokens + " tokens)"],
      ["mean reward", fmt(b.reward_mean)],
      ["kept", b.kept_tokens + " tokens (" + clipped + " clipped, " + (100 * clipped / Math.max(b.valid_tokens, 1)).toFixed(1) + "%)"],
    ];
    if (ec.eq23 !== undefined) rows.push(["\u03a3 terms", signed(ec.eq23) + " (eq. 23, whole batch: change of the mean H over the " + b.kept_tokens +
      " kept tokens, entropy_kept, not of the all-token mean H)"]);
    if (ec.corollary4 !== undefined) rows.push(["predicted", signed(ec.corollary4) + " (Corollary 4 = eq. 23 " +
      (ec.dropped_term >= 0 ? "+ " : "\u2212 ") + fmt(Math.abs(ec.dropped_term)) + ")"]);
    const regions = REGIONS.filter(([key]) => m["entropy_change/by_region/" + key] !== undefined &&
      m["entropy_change/by_region/" + key] !== null);
    if (regions.length) rows.push(["by region", regions.map(([key, name]) => name + " " +
      signed(m["entropy_change/by_region/" + key])).join(" \u00b7 ") + " (the predicted change, split)"]);
    if (m["entropy_change/first_order"] !== undefined) rows.push(["first order", signed(m["entropy_change/first_order"]) + " (through the network)"]);
    if (m["entropy_change/realised"] !== undefined) rows.push(["realised", signed(m["entropy_change/realised"])]);
    rows.push(["written", rec.groups.length + " of " + b.groups + " groups, " + written + " tokens" +
      (termsKnown && ec.eq23 !== undefined ? " (terms sum to " + signed(writtenTerms) + ")" : "")]);
    if (!termsKnown) rows.push(["terms", "not known for this loss (" + esc(rec.loss_type || "?") + "): its weights depend " +
      "on how the engine splits the batch; colour by \u2212A S_c, the term without its step size"]);
    for (const mk of marksOf(rec)) {
      let n = 0;
      for (const g of rec.groups) for (const resp of g.responses) for (const x of resp[mk.key] || []) n += x;
      rows.push(["marked", n + " written tokens: " + mk.label]);
    }
    return '<dl class="summary">' + rows.map(([k, v]) => "<dt>" + esc(k) + "</dt><dd>" + esc(v) + "</dd>").join("") + "</dl>";
  }

  function runHtml(r, run, step, stat, scale) {
    const s = run.settings || {};
    const bits = ["method " + (s.method || "?")];
    if (s.mu !== null && s.mu !== undefined) bits.push("mu " + s.mu);
    if (s.max_frac !== null && s.max_frac !== undefined && s.method === "clip_v") bits.push("max_frac " + s.max_frac);
    if (s.seed !== null && s.seed !== undefined) bits.push("seed " + s.seed);
    if (s.lr !== null && s.lr !== undefined) bits.push("lr " + s.lr);
    if (run.source && run.source !== "trainer") bits.push("from " + run.source);
    let out = '<section class="run" aria-labelledby="run-' + r + '-title"><h2 id="run-' + r + '-title">' + esc(run.name) +
      '</h2><p class="settings">' + esc(bits.join(" \u00b7 ")) + "</p>";
    const rec = run.steps[String(step)];
    if (!rec) {
      return out + '<p class="missing">No samples at step ' + step + " in this run (sampled: " +
        esc(run.available.join(", ")) + ").</p></section>";
    }
    out += summaryHtml(rec);
    rec.groups.forEach((g, k) => {
      const rewards = g.responses.map((x) => short(x.reward));
      out += '<div class="group"><h3>Group ' + (g.index + 1) + " of " + rec.batch.groups + " \u00b7 rewards " +
        esc(rewards.join(", ")) + '</h3><div class="prompt" aria-label="prompt">' + esc(g.prompt) + "</div>";
      g.responses.forEach((resp, j) => {
        const a = resp.advantage;
        const cls = a > 0 ? "pos" : a < 0 ? "neg" : "";
        const cut = resp.length > resp.text.length ? " \u00b7 first " + resp.text.length + " of " + resp.length + " tokens written" : "";
        out += '<div class="resp"><div class="resp-head">response ' + (j + 1) + " \u00b7 reward " + short(resp.reward) +
          ' \u00b7 <span class="' + cls + '">A ' + (a === null ? "per token" : signed(a)) + "</span> \u00b7 " + resp.length +
          " tokens \u00b7 " + (resp.finished ? "finished" : "truncated") + cut + '</div><div class="tokens">';
        for (let t = 0; t < resp.text.length; t++) out += tokenHtml(r, k, j, rec, resp, t, stat, scale);
        out += "</div></div>";
      });
      out += "</div>";
    });
    out += '<div class="tops"><h3>Tokens of the whole batch that moved entropy most</h3>' +
      topTable(r, rec, "raise", "Raise entropy most (largest terms)") +
      topTable(r, rec, "lower", "Lower entropy most (smallest terms)") +
      topTable(r, rec, "removed", "Clipped by the method (largest would-be terms)") + "</div>";
    return out + "</section>";
  }

  function legendHtml(stat, scale, marks) {
    const q = Math.round(100 * DATA.scale_quantile);
    const marked = marks.map((m, i) => '<span><span class="tok mark-' + i + '">x</span> ' + esc(m.label) +
      " (not clipped: the monitor changes no loss)</span>").join("");
    let ramp, words;
    if (stat.signed) {
      ramp = "linear-gradient(to right, rgba(" + NEG + ",0.7), #fff, rgba(" + POS + ",0.7))";
      words = stat.key === "term" || stat.key === "push" ? ["lowers entropy", "raises entropy"] : ["negative", "positive"];
    } else {
      ramp = "linear-gradient(to right, #fff, rgba(" + SEQ + ",0.6))";
      words = stat.key === "logp" ? ["likely", "unlikely"] : ["low", "high"];
    }
    const lo = stat.signed ? "\u2212" + fmt(scale) : "0";
    const hi = stat.key === "logp" ? "\u2212" + fmt(scale) : (stat.signed ? "+" : "") + fmt(scale);
    if (!(scale > 0)) {  // nothing to colour: say why instead of a "-0 ... +0" ramp
      return '<span class="ramp"><strong>' + esc(stat.label) + ":</strong> no value at this step" +
        (stat.key === "term" ? " (the loss's step sizes are not known: pick \u2212A S_c)" : " is non-zero") + "</span>" +
        '<span><span class="tok clipped">x</span> clipped: removed from the loss by the method\'s filter</span>' + marked +
        '<span class="help">' + esc(stat.help) + "</span>";
    }
    return '<span class="ramp"><strong>' + esc(stat.label) + ':</strong> <span class="end">' + esc(words[0]) + " " + lo +
      '</span><span class="bar" style="background:' + ramp + '" role="img" aria-label="colour scale from ' + esc(words[0]) +
      " to " + esc(words[1]) + '"></span><span class="end">' + hi + " " + esc(words[1]) + "</span></span>" +
      "<span>colours saturate at the " + q + "th percentile of |value| over this step's tokens (" + fmt(scale) +
      "); values are exact on hover or focus</span>" +
      '<span><span class="tok clipped">x</span> clipped: removed from the loss by the method\'s filter</span>' + marked +
      '<span><span class="tok cont">\u00b7</span> continues the character before it</span>' +
      "<span>regions: A+ / A\u2212 by the advantage's sign, likely where S* > 0 (log p > \u2212H), unlikely where " +
      "S* \u2264 0; the summary splits the predicted change by them, each token's region on hover</span>" +
      '<span class="help">' + esc(stat.help) + "</span>";
  }

  function render() {
    const stat = statOf(state.stat), scale = scaleOf(state.step, stat.key);
    $("runs").innerHTML = DATA.runs.map((run, r) => runHtml(r, run, state.step, stat, scale)).join("");
    const marks = [];
    for (const run of DATA.runs) {
      const rec = run.steps[String(state.step)];
      for (const m of rec ? marksOf(rec) : []) if (!marks.some((x) => x.key === m.key)) marks.push(m);
    }
    $("legend").innerHTML = legendHtml(stat, scale, marks);
    $("prev").disabled = DATA.steps.indexOf(state.step) <= 0;
    $("next").disabled = DATA.steps.indexOf(state.step) >= DATA.steps.length - 1;
    const again = state.selected && $(state.selected);
    if (again) select(again); else clearDetails();
  }

  function clearDetails() {
    $("detail-body").innerHTML = '<p class="hint">Hover over or focus a token to see its values.</p>';
  }

  function select(el) {
    for (const old of document.querySelectorAll(".tok.sel")) old.classList.remove("sel");
    el.classList.add("sel");
    state.selected = el.id;
    const r = +el.dataset.run, k = +el.dataset.group, j = +el.dataset.resp, pos = +el.dataset.pos;
    const run = DATA.runs[r], rec = run.steps[String(state.step)], g = rec.groups[k], resp = g.responses[j];
    const v = (key) => tokenValue(resp, pos, key);
    const kept = !!resp.kept[pos];
    const term = kept ? signed(v("term")) : "0, clipped (would have been " + signed(wouldBe(resp, pos)) + ")";
    const logp = v("logp");
    const rows = [
      ["run", "run", run.name],
      ["where", "where", "step " + state.step + " \u00b7 group " + (g.index + 1) + " \u00b7 response " + (j + 1) +
        " \u00b7 token " + (pos + 1) + " of " + resp.length],
      ["logp", "log p", fmt(logp)],
      ["p", "p", logp === null ? "\u2014" : fmt(Math.exp(logp))],
      ["entropy", "H", fmt(v("entropy"))],
      ["s_star", "S*", signed(v("s_star"))],
      ["s_centered", "S_c", signed(v("s_centered"))],
      ["advantage", "A", signed(advantageAt(resp, pos))],
      ["region", "region", regionOf(advantageAt(resp, pos), v("s_star"))],
      ["kept", "in the loss", kept ? "kept" : "clipped (removed by the method's filter)"],
      ["term", "term, eq. 23", term],
      ["push", "\u2212A S_c", signed(v("push"))],
      ["marks", "would be dropped by", markedBy(rec, resp, pos).map((m) => m.label.replace(/ would drop it$/, "")).join("; ") ||
        (marksOf(rec).length ? "none of the watched filters" : "\u2014")],
      ["reward", "reward of the response", short(resp.reward)],
    ];
    $("detail-body").innerHTML = '<p class="tok-text">\u201c' + esc(shown(resp.text[pos])) + "\u201d</p><dl>" +
      rows.map(([f, k2, val]) => "<dt>" + esc(k2) + '</dt><dd data-field="' + f + '">' + esc(val) + "</dd>").join("") + "</dl>";
  }

  function tokensOfRun(el) { return Array.from(el.closest(".run").querySelectorAll(".tok")); }

  function onKey(ev) {
    const el = ev.target;
    if (!el.classList || !el.classList.contains("tok")) return;
    const all = tokensOfRun(el), i = all.indexOf(el);
    const inResp = Array.from(el.parentNode.querySelectorAll(".tok"));
    let to = null;
    if (ev.key === "ArrowRight") to = all[i + 1];
    else if (ev.key === "ArrowLeft") to = all[i - 1];
    else if (ev.key === "Home") to = inResp[0];
    else if (ev.key === "End") to = inResp[inResp.length - 1];
    if (to) { ev.preventDefault(); to.focus(); }
  }

  function setStep(step) { state.step = step; $("step").value = String(step); render(); }

  function init() {
    $("step").innerHTML = DATA.steps.map((s) => {
      const missing = DATA.runs.filter((run) => !run.steps[String(s)]).map((run) => run.name);
      return '<option value="' + s + '">step ' + s + (missing.length ? " (not in " + esc(missing.join(", ")) + ")" : "") + "</option>";
    }).join("");
    $("stat").innerHTML = STATS.map((s) => '<option value="' + s.key + '">' + esc(s.label) + "</option>").join("");
    // a loss whose step sizes are unknown (TRL's bnpo, vespo) has no terms: colour by -A S_c, defined for every loss
    if (!(scaleOf(state.step, "term") > 0) && scaleOf(state.step, "push") > 0) { state.stat = "push"; $("stat").value = "push"; }
    $("step").addEventListener("change", (ev) => setStep(+ev.target.value));
    $("stat").addEventListener("change", (ev) => { state.stat = ev.target.value; render(); });
    $("prev").addEventListener("click", () => { const i = DATA.steps.indexOf(state.step); if (i > 0) setStep(DATA.steps[i - 1]); });
    $("next").addEventListener("click", () => {
      const i = DATA.steps.indexOf(state.step);
      if (i < DATA.steps.length - 1) setStep(DATA.steps[i + 1]);
    });
    $("values").addEventListener("change", (ev) => document.body.classList.toggle("show-values", ev.target.checked));
    const runs = $("runs");
    runs.addEventListener("mouseover", (ev) => { if (ev.target.classList.contains("tok")) select(ev.target); });
    runs.addEventListener("focusin", (ev) => { if (ev.target.classList.contains("tok")) select(ev.target); });
    runs.addEventListener("keydown", onKey);
    runs.addEventListener("click", (ev) => {
      const go = ev.target.closest("button[data-goto]");
      if (go && $(go.dataset.goto)) $(go.dataset.goto).focus();
    });
    render();
    document.body.dataset.ready = "1";
  }

  init();
})();
