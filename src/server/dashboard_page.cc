// GET /dashboard: one self-contained page (no CDN, no build step; vanilla JS and a canvas)
// that polls GET /v1/kv/state about once a second and draws the KV pool's block map colored by
// state, the running requests with their tokens and blocks, and the request figures. The page
// holds no data of its own: with --api-key it asks for the key once (kept for the tab only)
// and sends it as the /v1 routes want it.
#include <string_view>

#include "server/openai_server.h"

namespace kvs::server {

namespace {

constexpr std::string_view kPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvserve KV dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font:14px system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:18px;margin:0 0 8px}
.row{display:flex;gap:24px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:8px 0}
.k{color:#666}.v{font-weight:600}
canvas{border:1px solid #ccc;background:#fff}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:right}
.sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 10px;vertical-align:middle}
#err{color:#b00;cursor:default}
</style></head><body>
<h1>kvserve — KV cache <span id="model" class="k"></span></h1>
<div id="err"></div>
<div class="row">
 <div class="card">pool: <span class="v" id="geom">-</span><br>
  <span class="sw" style="background:#e8e8e8"></span>free <span class="v" id="n-free">0</span>
  <span class="sw" style="background:#6baed6"></span>cached <span class="v" id="n-cached">0</span>
  <span class="sw" style="background:#31a354"></span>in use <span class="v" id="n-used">0</span>
  <span class="sw" style="background:#e6550d"></span>shared <span class="v" id="n-shared">0</span></div>
 <div class="card">tokens/s <span class="v" id="tps">-</span> · prefix hit rate <span class="v" id="hit">-</span><br>
  TTFT p50/p90/p99 <span class="v" id="ttft">-</span> · ITL p50/p90/p99 <span class="v" id="itl">-</span></div>
 <div class="card">running <span class="v" id="n-running">0</span> · waiting <span class="v" id="n-waiting">0</span>
  · requests done <span class="v" id="n-done">0</span></div>
 <div class="card">tier hits (blocks): <span class="v" id="tiers">none</span>
  <br>evicted tokens <span class="v" id="evicted">0</span> · preemptions <span class="v" id="preempt">0</span></div>
</div>
<canvas id="map" width="960" height="240"></canvas>
<div class="card"><table id="requests"><thead><tr><th>request</th><th>prompt</th><th>cached</th>
<th>output</th><th>blocks</th></tr></thead><tbody></tbody></table></div>
<script>
"use strict";
const colors = {f: "#e8e8e8", c: "#6baed6", u: "#31a354", s: "#e6550d"};
let key = sessionStorage.getItem("kvserve-key") || "";
let last = null;
let asked_key = false;
function askKey() {
  asked_key = true;
  key = window.prompt("API key (--api-key)") || "";
  sessionStorage.setItem("kvserve-key", key);
}
const $ = (id) => document.getElementById(id);
const ms = (s) => (s * 1000).toFixed(0) + " ms";
function draw(st) {
  const canvas = $("map"), ctx = canvas.getContext("2d");
  const n = st.blocks.length, cols = Math.max(1, Math.ceil(Math.sqrt(n * 4)));
  const cell = Math.max(2, Math.min(16, Math.floor(canvas.width / cols)));
  const rows = Math.ceil(n / Math.max(1, Math.floor(canvas.width / cell)));
  canvas.height = Math.max(cell, rows * cell);
  const per = Math.max(1, Math.floor(canvas.width / cell));
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = colors[st.blocks[i]] || "#000";
    ctx.fillRect((i % per) * cell, Math.floor(i / per) * cell, cell - (cell > 3 ? 1 : 0),
                 cell - (cell > 3 ? 1 : 0));
  }
  canvas.dataset.blocks = String(n);
}
function render(st) {
  $("model").textContent = st.model;
  $("geom").textContent = st.num_blocks + " blocks × " + st.block_size + " tokens, K " +
      st.cache_type_k + " / V " + st.cache_type_v;
  for (const k of ["free", "cached", "used", "shared"]) $("n-" + k).textContent = st.counts[k];
  $("n-running").textContent = st.running.length;
  $("n-waiting").textContent = st.waiting;
  const c = st.counters, now = performance.now();
  $("n-done").textContent = c.request_success_total;
  // One entry per tier the server has, in lookup order (/v1/kv/state's tiers).
  $("tiers").textContent = st.tiers.length ? st.tiers.map(
      t => t.tier + " " + t.hits_total + (t.up ? "" : " (down)")).join(" · ") : "none";
  $("evicted").textContent = c.evicted_tokens_total;
  $("preempt").textContent = c.preemptions_total;
  $("hit").textContent = c.prefix_cache_queries_total > 0 ?
      (100 * c.prefix_cache_hits_total / c.prefix_cache_queries_total).toFixed(1) + "%" : "-";
  // Tokens generated so far: finished requests' and the running ones' (a request counts in
  // the totals only when it ends).
  const generated = c.generation_tokens_total +
      st.running.reduce((sum, r) => sum + r.output_tokens, 0);
  if (last) {
    const dt = (now - last.t) / 1000;
    $("tps").textContent = dt > 0 ? Math.max(0, (generated - last.generated) / dt).toFixed(1) : "-";
  }
  last = {t: now, generated: generated};
  const l = st.latency;
  $("ttft").textContent = [l.ttft_p50_s, l.ttft_p90_s, l.ttft_p99_s].map(ms).join(" / ");
  $("itl").textContent = [l.itl_p50_s, l.itl_p90_s, l.itl_p99_s].map(ms).join(" / ");
  const body = $("requests").tBodies[0];
  body.replaceChildren(...st.running.map((r) => {
    const tr = document.createElement("tr");
    tr.className = "request";
    const id = r.choice > 0 ? r.id + " #" + r.choice : r.id;  // a request's n choices apart
    for (const v of [id, r.prompt_tokens, r.cached_tokens, r.output_tokens, r.blocks.length]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    return tr;
  }));
  draw(st);
}
async function poll() {
  // When the shown state was asked for: a state asked for after a moment reflects it (tests wait
  // on this, not on when a reply that may have been in flight arrived).
  const asked = Date.now();
  try {
    const res = await fetch("/v1/kv/state", {headers: key ? {Authorization: "Bearer " + key} : {}});
    if (res.status === 401) {
      // Asked once by itself; after that only when the message is clicked (no prompt loop).
      if (!asked_key) askKey();
      $("err").textContent = "GET /v1/kv/state: the API key is missing or wrong (click to enter it)";
    } else if (!res.ok) {
      $("err").textContent = "GET /v1/kv/state: HTTP " + res.status;
    } else {
      $("err").textContent = "";
      render(await res.json());
      document.body.dataset.asked = String(asked);
    }
  } catch (e) {
    $("err").textContent = "server unreachable: " + e.message;
  }
  setTimeout(poll, 1000);
}
$("err").addEventListener("click", () => { if ($("err").textContent.includes("API key")) askKey(); });
poll();
</script></body></html>
)HTML";

}  // namespace

std::string_view DashboardPage() {
  return kPage;
}

}  // namespace kvs::server
