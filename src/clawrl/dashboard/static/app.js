// clawrl dashboard: plain JavaScript, no build step, no network beyond this server.
// Every string from the store goes through textContent (el() below), never innerHTML.
"use strict";

const body = document.body;
const PREFIX = body.dataset.prefix;
const POLL = Number(body.dataset.poll) || 2000;
const main = document.getElementById("main");
const live = document.getElementById("live");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const svgNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children.flat(Infinity)) if (c) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
  return x.toFixed(digits);
}
function ago(ts) {
  if (!ts) return "–";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return new Date(ts * 1000).toLocaleString();
}
// a relative time that keeps counting between refreshes (see tickTimes)
function when(ts) { return el("span", { class: "ts", "data-ts": ts ? String(ts) : null, text: ago(ts) }); }
function tickTimes() {
  for (const node of document.querySelectorAll("[data-ts]")) node.textContent = ago(Number(node.dataset.ts));
}
function sessionHref(id) { return `${PREFIX}/session?id=${encodeURIComponent(id)}`; }
function short(id) { return id ? id.slice(0, 8) : "–"; }
function scoreBadge(score) {
  const label = score === null || score === undefined ? "no judgment" : score > 0 ? "+1" : score < 0 ? "−1" : "0";
  const cls = score === null || score === undefined ? "none" : score > 0 ? "good" : score < 0 ? "bad" : "zero";
  return el("span", { class: `score ${cls}`, text: label });
}
function card(label, value, note) {
  return el("div", { class: "card", "data-card": label },
    el("div", { class: "card-label", text: label }),
    el("div", { class: "card-value", text: value }),
    note ? el("div", { class: "card-note", text: note }) : null);
}
function table(headers, rows, cls) {
  return el("table", { class: cls || "" },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
    el("tbody", {}, rows));
}

function tick(y, step, magnitude) {
  // the decimals the tick step has (0.25 -> 2), so ticks read as the round numbers they are;
  // exponents only for tiny values
  if (Math.abs(y) < step * 1e-9) return "0";
  if (magnitude < 1e-3) return y.toExponential(1);
  let decimals = 0;
  while (decimals < 8 && Math.abs(Math.round(step * 10 ** decimals) - step * 10 ** decimals) > 1e-6) decimals++;
  return y.toFixed(decimals);
}
function niceStep(raw) {
  // 1, 2, 2.5 or 5 times a power of ten (round tick values)
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * p) return m * p;
  return 10 * p;
}

// -- a small SVG line chart -------------------------------------------------------------------
function lineChart(title, series, opts = {}) {
  // series: [{name, points: [[x, y], ...], band: [[x, lo, hi], ...]?}]
  const W = opts.width || 460, H = opts.height || 180, L = 48, R = 10, T = 22, B = 26;
  const pts = series.flatMap((s) => s.points);
  const bands = series.flatMap((s) => s.band || []);
  const wrap = el("figure", { class: "chart", "data-chart": title });
  wrap.append(el("figcaption", { text: title }));
  if (!pts.length) {
    wrap.append(el("p", { class: "muted", text: "no points yet" }));
    return wrap;
  }
  const xs = pts.map((p) => p[0]);
  const ys = pts.map((p) => p[1]).concat(bands.flatMap((b) => [b[1], b[2]]));
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  const nonnegative = y0 >= 0;
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) {
    if (y0 === 0) y1 = 1;
    else { const d = Math.abs(y0) * 0.1; y0 -= d; y1 += d; }
  }
  const stepY = niceStep((y1 - y0) / 4);
  y0 = Math.floor(y0 / stepY) * stepY; y1 = Math.ceil(y1 / stepY) * stepY;
  if (nonnegative) y0 = Math.max(0, y0); // fractions, KL, step times: no negative axis
  const nTicks = Math.round((y1 - y0) / stepY);
  const magnitude = Math.max(Math.abs(y0), Math.abs(y1));
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": title });
  for (let i = 0; i <= nTicks; i++) {
    const y = y0 + stepY * i;
    g.append(svg("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }));
    g.append(svg("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end", class: "tick" }, tick(y, stepY, magnitude)));
  }
  const xt = Array.from(new Set(xs)).sort((a, b) => a - b);
  const every = Math.max(1, Math.ceil(xt.length / 8));
  xt.forEach((x, i) => {
    if (i % every === 0 || i === xt.length - 1)
      g.append(svg("text", { x: sx(x), y: H - 8, "text-anchor": "middle", class: "tick" }, String(x)));
  });
  g.append(svg("text", { x: 4, y: H - 8, "text-anchor": "start", class: "axis" }, opts.xlabel || "step"));
  series.forEach((s, k) => {
    if (s.band && s.band.length) {
      const up = s.band.map((b) => `${sx(b[0])},${sy(b[2])}`);
      const down = s.band.slice().reverse().map((b) => `${sx(b[0])},${sy(b[1])}`);
      g.append(svg("polygon", { points: up.concat(down).join(" "), class: `band c${k}` }));
    }
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0])},${sy(p[1])}`).join(" ");
    g.append(svg("path", { d, class: `line c${k}` }));
    s.points.forEach((p) => g.append(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, class: `dot c${k}` },
      svg("title", {}, `${s.name || title} at ${p[0]}: ${fmt(p[1])}`))));
  });
  wrap.append(g);
  wrap.dataset.points = String(pts.length);
  return wrap;
}

// -- pages -----------------------------------------------------------------------------------
function renderOverview(d) {
  const last = d.last_step || {};
  const cards = el("section", { class: "cards" },
    card("policy version", `v${d.policy_version}`, d.versions.length ? `published ${ago(d.versions[d.versions.length - 1].time)}` : "base weights"),
    card("training step", String(d.step), last.time ? `last step ${ago(last.time)}` : d.step ? "from the store (no metrics file)" : "no step yet"),
    card("requests/s", fmt(d.requests_per_s, 2), `last ${Math.round(d.rate_window_s)} s`),
    card("tokens/s", fmt(d.tokens_per_s, 1), "sampled tokens"),
    card("sessions", String(d.sessions), `${d.turns} turns`),
    d.judging ? card("judge backlog", String(d.judge_backlog), "turns not judged yet (incl. waiting for a next state)")
      : card("judge", "off", "recording only: serve --method rl|opd|combine judges and trains"),
    card("judged", String(d.judged), "turns with a verdict"),
    card("samples ready", String(d.samples_ready), "judged, waiting for a step"),
    card("trained", String(d.trained), "samples in a step"));
  const versions = d.versions.slice().reverse().slice(0, 10).map((v) =>
    el("tr", {}, el("td", { text: `v${v.version}` }), el("td", { text: String(v.step) }), el("td", {}, when(v.time))));
  const drops = d.drops.map((x) =>
    el("tr", {}, el("td", { class: "mono", text: x.reason }), el("td", { text: String(x.count) }), el("td", { text: x.text })));
  const keys = ["loss", "reward/mean", "kl/ref", "clip/low_frac", "clip/high_frac", "hint/rate", "samples/trained", "time/step", "grad/norm"];
  const metrics = keys.filter((k) => last[k] !== undefined).map((k) =>
    el("tr", {}, el("td", { class: "mono", text: k }), el("td", { text: fmt(last[k]) })));
  return [
    cards,
    el("section", { class: "cols" },
      el("div", {}, el("h2", { text: "Policy versions" }),
        versions.length ? table(["version", "step", "published"], versions)
          : el("p", { class: "muted", text: d.metrics ? "only the base weights so far" : "no trainer output directory given (clawrl dashboard --output-dir DIR): no version history" })),
      el("div", {}, el("h2", { text: "Not trained on, by reason" }),
        drops.length ? table(["reason", "turns", "what it means"], drops, "drops") : el("p", { class: "muted", text: "nothing dropped" })),
      el("div", {}, el("h2", { text: last.step ? `Last step (${last.step})` : "Last step" }),
        metrics.length ? table(["metric", "value"], metrics) : el("p", { class: "muted", text: "no training step yet" }))),
  ];
}

const params = new URLSearchParams(location.search);
let sessionQuery = params.get("q") || "";
let sessionUser = params.get("user");  // null: every user's sessions; "" : requests with no user
let sessionOffset = Math.max(0, Number(params.get("offset")) || 0);
const PAGE = 100;
function setSessionUrl() {
  const q = new URLSearchParams();
  if (sessionQuery) q.set("q", sessionQuery);
  if (sessionUser !== null) q.set("user", sessionUser);
  if (sessionOffset) q.set("offset", String(sessionOffset));
  history.replaceState(null, "", q.toString() ? `?${q}` : location.pathname);
}
function pager(d) {
  const first = d.total ? d.offset + 1 : 0, last = d.offset + d.sessions.length;
  const go = (offset) => () => { sessionOffset = Math.max(0, offset); setSessionUrl(); refresh(); };
  return el("div", { class: "pager" },
    el("span", { class: "muted", id: "session-count", text: `${first}–${last} of ${d.total} session(s)${d.user !== null && d.user !== undefined ? ` of user “${d.user || "(none)"}”` : ""}${d.query ? ` matching “${d.query}”` : ", newest first"}` }),
    d.user !== null && d.user !== undefined ? el("button", { onclick: filterUser(null), text: "all users" }) : null,
    d.offset > 0 ? el("button", { onclick: go(d.offset - PAGE), text: "← newer" }) : null,
    last < d.total ? el("button", { onclick: go(d.offset + PAGE), text: "older →" }) : null);
}
function filterUser(user) {
  return (e) => { if (e) e.preventDefault(); sessionUser = user; sessionOffset = 0; setSessionUrl(); refresh(); };
}
function userCell(users) {
  if (!users || !users.length) return el("td", { class: "muted", text: "–" });
  const cell = el("td", {});
  users.forEach((u, i) => {
    if (i) cell.append(", ");
    cell.append(el("a", { href: `?user=${encodeURIComponent(u)}`, class: "user", "data-user": u, onclick: filterUser(u), text: u }));
  });
  return cell;
}
function renderSessions(d) {
  const rows = d.sessions.map((s) => el("tr", { "data-session": s.id },
    el("td", {}, el("a", { href: sessionHref(s.id), class: "mono", text: s.id.length > 20 ? s.id.slice(0, 20) + "…" : s.id })),
    el("td", { text: s.client || "–" }), userCell(s.users), el("td", { text: s.harness || "–" }), el("td", { text: s.attribution }),
    el("td", { text: String(s.turns) }), el("td", { text: String(s.trainable) }),
    el("td", { text: String(s.side) }), el("td", { text: String(s.failed) }),
    el("td", { text: String(s.tokens) }), el("td", {}, when(s.last_activity)),
    el("td", { text: s.ended ? "ended" : "open" })));
  return [
    pager(d),
    rows.length ? table(["session", "client", "user", "harness", "attribution", "turns", "trainable turns", "side", "failed", "tokens", "last activity", "state"], rows, "sessions")
      : el("p", { class: "muted", text: "no sessions yet: send a request to the gateway" }),
  ];
}

function messageBlock(m) {
  return el("div", { class: `msg role-${m.role}` }, el("span", { class: "role", text: m.role }), el("pre", { text: m.text || "(empty)" }));
}
function renderTurn(t, open) {
  const head = el("div", { class: "turn-head" },
    el("span", { class: "mono strong", text: short(t.id) }),
    t.kind !== "main" ? el("span", { class: "tag warn", title: "a side call: recorded, never trained", text: t.kind }) : null,
    el("span", { class: "tag", title: "the policy version that sampled this answer", text: `v${t.version}` }),
    t.user ? el("span", { class: "tag", title: "whose request it answered", text: `user ${t.user}` }) : null,
    t.adapter_version !== null && t.adapter_version !== undefined ? el("span", { class: "tag", title: "the version of the user's own adapter that sampled it (on top of the policy)", text: `adapter v${t.adapter_version}` }) : null,
    el("span", { class: `tag st-${t.status}`, text: t.status }),
    el("span", { class: "muted" }, `${t.finish_reason || "–"} · prompt ${t.prompt_tokens} · completion ${t.completion_tokens} tokens · ${t.latency_s === null ? "–" : fmt(t.latency_s, 2) + " s"} · `, when(t.created_at)),
    t.root_reason && t.root_reason !== "first" ? el("span", { class: "tag warn", text: t.root_reason }) : null,
    t.attribution ? el("span", { class: "muted", text: `attributed by ${t.attribution}` }) : null);
  const msgs = el("details", { class: "messages", "data-key": `m-${t.id}`, open: open.has(`m-${t.id}`) || t.messages.length <= 2 ? "" : null },
    el("summary", { text: `${t.messages.length} new message(s)` + (t.messages_skipped ? ` (${t.messages_skipped} earlier ones are in the parent turn)` : "") }),
    t.messages.map(messageBlock));
  const out = t.output;
  const completion = el("div", { class: "completion" }, el("span", { class: "role", text: "policy" }),
    out.reasoning ? el("pre", { class: "reasoning", text: out.reasoning }) : null,
    el("pre", { text: out.content || (out.tool_calls.length ? "" : "(empty)") }),
    out.tool_calls.map((c) => el("pre", { class: "tool-call", text: `→ ${c}` })));
  let ns;
  if (t.next_state) {
    const s = t.next_state;
    ns = el("div", { class: "next-state", "data-role": s.role },
      el("div", { class: "box-title" }, `next state (${s.role})`,
        s.child_turn_id ? [" → ", el("a", { href: `#turn-${s.child_turn_id}`, text: `turn ${short(s.child_turn_id)}` })] : null),
      s.messages.map(messageBlock),
      s.feedback.map((f) => el("div", { class: "muted", text: `feedback ${f.reward}${f.comment ? ": " + f.comment : ""}` })),
      s.note ? el("div", { class: "muted", text: s.note }) : null);
  } else {
    const ended = t.training.state === "dropped" && t.training.reason === "no_next_state";
    ns = el("div", { class: "next-state none", text: ended ? "no next state: the session ended before a reply" : "no next state yet" });
  }
  let jd;
  if (t.judgment && t.judgment.skipped) {
    jd = el("div", { class: "judgment none", text: "not sent to the judge: nothing came after this answer" });
  } else if (t.judgment) {
    const j = t.judgment;
    jd = el("div", { class: "judgment" },
      el("div", { class: "box-title" }, "judge ", scoreBadge(j.score), el("span", { class: "muted", text: ` ${j.backend}${j.latency_s !== null ? " · " + fmt(j.latency_s, 2) + " s" : ""}${j.reason ? " · " + j.reason : ""}` })),
      j.votes.length ? el("div", { class: "votes" }, `${j.votes.length} votes: `, j.votes.map((v) => v.abstain ? el("span", { class: "vote abstain", title: v.abstain, text: "abstain" }) : scoreBadge(v.score))) : null,
      j.hint ? el("div", { class: "hint" }, el("span", { class: "box-title", text: "hint " }), el("q", { text: j.hint })) : null);
  } else {
    jd = el("div", { class: "judgment none", text: "not judged yet" });
  }
  const tr = el("div", { class: `training tr-${t.training.state}`, text: t.training.text });
  const err = t.error ? el("pre", { class: "turn-error", text: t.error }) : null;
  return el("article", { class: "turn", id: `turn-${t.id}`, "data-turn": t.id, style: `margin-left:${Math.min(t.depth, 12) * 18}px` },
    head, msgs, completion, err, el("div", { class: "cols2" }, ns, jd), tr);
}
function renderSession(d) {
  const open = new Set([...document.querySelectorAll("details[open]")].map((x) => x.dataset.key));
  const counts = Object.entries(d.untrainable).map(([k, v]) => `${k.replace("untrainable/", "")} ${v}`).join(", ");
  return [
    el("p", {}, el("a", { href: `${PREFIX}/sessions`, text: "← all sessions" })),
    el("h2", { class: "mono", text: `session ${d.id}` }),
    el("p", { class: "muted" }, `client ${d.client || "–"} · attribution ${d.attribution} · created `, when(d.created_at),
      d.ended_at ? [" · ended ", when(d.ended_at)] : " · open", ` · ${d.turns.length} turn(s)${counts ? " · untrainable: " + counts : ""}`),
    d.turns.map((t) => renderTurn(t, open)),
  ];
}

function renderTraining(d) {
  const out = [];
  const demo = d.demo;
  if (demo && demo.evaluations.length) {
    const evs = demo.evaluations;
    const checks = Object.keys(evs[0].checks || {});
    out.push(el("h2", { text: `Held-out score (${demo.method}, seed ${demo.seed})` }));
    out.push(el("section", { class: "charts" }, lineChart("rubric score with 95% interval", [{ name: "score", points: evs.map((e) => [e.step, e.score]), band: evs.filter((e) => e.ci.length === 2).map((e) => [e.step, e.ci[0], e.ci[1]]) }])));
    const rate = (c) => c ? `${fmt(c.rate, 2)}` + (c.ci.length === 2 ? ` [${fmt(c.ci[0], 2)}, ${fmt(c.ci[1], 2)}]` : "") : "–";
    const rows = evs.map((e) => el("tr", {}, el("td", { text: String(e.step) }), el("td", { text: `v${e.version}` }),
      el("td", { text: `${fmt(e.score)} [${fmt(e.ci[0])}, ${fmt(e.ci[1])}]` }), checks.map((c) => el("td", { text: rate(e.checks[c]) }))));
    out.push(el("p", { class: "muted", text: "Each check: pass rate on the held-out problems [95% bootstrap interval]." }));
    out.push(table(["step", "version", "score [95% CI]", ...checks], rows, "evals"));
    if (demo.examples.length) {
      out.push(el("h2", { text: "Before and after: the held-out answers that improved most (not a typical pair)" }));
      demo.examples.forEach((x) => out.push(el("div", { class: "example" },
        el("div", { class: "strong", text: x.question }),
        el("div", { class: "cols2" },
          el("div", {}, el("div", { class: "box-title", text: `before (score ${fmt(x.score_before, 2)})` }), el("pre", { text: x.before })),
          el("div", {}, el("div", { class: "box-title", text: `after (score ${fmt(x.score_after, 2)})` }), el("pre", { text: x.after }))))));
    }
  }
  out.push(el("h2", { text: `Training curves (${d.steps} step${d.steps === 1 ? "" : "s"})` }));
  out.push(el("section", { class: "charts" }, Object.entries(d.curves).map(([key, c]) => lineChart(c.title, [{ name: key, points: c.points }]))));
  if (d.tensorboard) out.push(el("p", { class: "muted" }, "TensorBoard: ", el("code", { text: `tensorboard --logdir ${d.tensorboard}` })));
  return out;
}

function bars(title, entries) {
  const total = entries.reduce((a, [, v]) => a + v, 0) || 1;
  return el("div", { class: "bars", "data-bars": title }, el("h2", { text: title }),
    entries.length ? entries.map(([k, v]) => el("div", { class: "bar-row" }, el("span", { class: "bar-label mono", text: k }),
      el("span", { class: "bar", style: `width:${Math.max(2, (100 * v) / total)}%` }), el("span", { class: "bar-value", text: `${v} (${Math.round((100 * v) / total)}%)` })))
      : el("p", { class: "muted", text: "none" }));
}
function renderJudge(d) {
  const order = ["+1", "-1", "0"];
  const dist = order.filter((k) => d.distribution[k] !== undefined).map((k) => [k.replace("-", "−"), d.distribution[k]]);
  const a = d.agreement;
  const agreement = a ? el("section", { class: "cards", "data-agreement": "1" },
    card("agrees with the user", a.compared ? a.rate.toFixed(2) : "–", `${a.agreed} of ${a.compared} turns the scenario knows and the judge scored ±1`),
    card("sign errors", a.sign_error_rate === null ? "–" : `${fmt(100 * a.sign_error_rate, 1)} %`, `${a.sign_errors} turns: +1 judged −1 or the reverse`),
    card("judged 0 / not yet", `${a.judge_neutral} / ${a.missing}`, "known turns without a ±1 verdict"))
    : el("p", { class: "muted", text: "agreement with ground truth: only where the scenario knows it (clawrl demo)" });
  const recent = d.recent.map((j) => el("tr", {},
    el("td", {}, el("a", { href: `${sessionHref(j.session_id)}#turn-${j.turn_id}`, class: "mono", text: short(j.turn_id) })),
    el("td", {}, scoreBadge(j.score)), el("td", { text: j.backend + (j.reason ? ` (${j.reason})` : "") }), el("td", { text: j.hint || "" }), el("td", {}, when(j.created_at))));
  return [
    el("section", { class: "cards" }, card("judged", String(d.judged), "with a verdict (+1, −1 or 0); " + (d.backends.join(", ") || "–")),
      card("with a hint", String(d.hinted), d.judged ? `${Math.round((100 * d.hinted) / d.judged)} % of judgments` : ""),
      card("latency p50", d.latency_p50_s === null ? "–" : `${fmt(d.latency_p50_s, 2)} s`, "per judgment (all votes)")),
    agreement,
    el("section", { class: "cols" }, bars("Scores", dist), bars("No verdict (the judge abstained or failed), by reason", Object.entries(d.no_judgment)),
      bars("Never sent to the judge, by reason", Object.entries(d.skipped)),
      bars(`Abstaining votes, by reason (of ${d.votes_seen} votes)`, Object.entries(d.vote_abstentions))),
    el("h2", { text: "Latest judgments" }),
    recent.length ? table(["turn", "score", "from", "hint", "when"], recent) : el("p", { class: "muted", text: "no judgments yet" }),
  ];
}

function renderMemory(d) {
  const turn = (e) => e.source_session_id
    ? el("a", { href: `${sessionHref(e.source_session_id)}#turn-${e.source_turn_id}`, class: "mono", text: short(e.source_turn_id) })
    : el("span", { class: "muted", text: "–" });
  const row = (e) => el("tr", {}, el("td", { class: "mono", text: short(e.id) }), el("td", { text: e.text }),
    el("td", { text: e.status + (e.end_reason ? ` (${e.end_reason})` : "") }), el("td", { text: e.source }), el("td", {}, turn(e)),
    el("td", { text: String(e.support) }),
    el("td", { class: "num", text: e.gap === null || e.gap === undefined ? "–" : `${e.gap.toFixed(3)} (${e.distilled})`, title: "mean gap (log-prob with the memory minus without, nats per token) of its last distilled turns: retired at memory.retire_gap" }),
    el("td", {}, when(e.updated_at)));
  const headers = ["entry", "text", "status", "source", "from turn", "support", "gap (turns)", "updated"];
  return [
    el("section", { class: "cards" }, card("active entries", String(d.active.length), d.enabled === false ? "memory is off for this server (clawrl serve --memory adds them to prompts)" : "added to the system message of main calls"),
      card("replaced", String(d.counts.replaced || 0), "a newer directive contradicted them"),
      card("evicted", String(d.counts.evicted || 0), "pushed out by the cap (memory.max_entries)"),
      card("retired", String(d.counts.retired || 0), "the weights alone follow them (clawrl serve --memory --distill)"),
      card("turned off", String(d.counts.disabled || 0), "by hand (clawrl memory edit --off)")),
    el("h2", { text: "Active" }),
    d.active.length ? table(headers, d.active.map(row)) : el("p", { class: "muted", text: "no entries: hints and feedback comments add them (clawrl memory add, POST /v1/memory)" }),
    el("h2", { text: "Ended" }),
    d.ended.length ? table(headers, d.ended.map(row)) : el("p", { class: "muted", text: "none" }),
  ];
}

// -- polling ---------------------------------------------------------------------------------
const PAGES = {
  overview: { api: () => "overview", render: renderOverview },
  sessions: { api: () => `sessions?q=${encodeURIComponent(sessionQuery)}&limit=${PAGE}&offset=${sessionOffset}${sessionUser !== null ? `&user=${encodeURIComponent(sessionUser)}` : ""}`, render: renderSessions },
  session: { api: () => `session?id=${encodeURIComponent(body.dataset.session)}`, render: renderSession },
  training: { api: () => "training", render: renderTraining },
  judge: { api: () => "judge", render: renderJudge },
  memory: { api: () => "memory", render: renderMemory },
};
const page = PAGES[body.dataset.page];
let lastText = null;
let content = el("div", { id: "content" });

function setup() {
  main.replaceChildren();
  if (body.dataset.page === "sessions") {
    let timer = null;
    const input = el("input", { type: "search", id: "search", placeholder: "search id, client, harness, attribution", value: sessionQuery,
      oninput: (e) => { clearTimeout(timer); timer = setTimeout(() => { sessionQuery = e.target.value; sessionOffset = 0; setSessionUrl(); refresh(); }, 250); } });
    main.append(el("div", { class: "toolbar" }, input));
  }
  main.append(content);
}

let seq = 0;
async function refresh() {
  const mine = ++seq;
  let text = null, failure = null;
  try {
    const res = await fetch(`${PREFIX}/api/${page.api()}`, { cache: "no-store", credentials: "same-origin" });
    if (res.ok) text = await res.text();
    else {
      failure = `HTTP ${res.status}`;
      try { const j = await res.json(); failure = (j.error && j.error.message) || failure; } catch (e) { /* not JSON */ }
    }
  } catch (e) {
    failure = "server unreachable: retrying";
  }
  if (mine !== seq) return; // a newer request (a search, a page change) has been sent since
  if (failure !== null) {
    lastText = null; // redraw when the server answers again, even with the same data
    content.replaceChildren(el("p", { class: "error", text: failure }));
    live.textContent = `error: ${failure}`; live.className = "live bad";
    return;
  }
  if (text !== lastText) {
    lastText = text;
    const y = window.scrollY;
    content.replaceChildren(...[page.render(JSON.parse(text))].flat(Infinity));
    window.scrollTo(0, y);
    if (location.hash && !content.dataset.jumped) {
      const target = document.getElementById(location.hash.slice(1));
      if (target) { target.scrollIntoView(); target.classList.add("focus"); content.dataset.jumped = "1"; }
    }
  }
  tickTimes();
  live.textContent = `${body.dataset.readonly ? "read-only · refreshed" : "live · updated"} ${new Date().toLocaleTimeString()}`; live.className = "live ok";
  body.dataset.loaded = String(Number(body.dataset.loaded || 0) + 1);
}

// the next poll starts when this one has finished: a slow server never gets a pile of requests
async function poll() {
  await refresh();
  setTimeout(poll, POLL);
}

setup();
poll();
