// The live KV dashboard in a real browser (Debian's chromium, driven by playwright-core): the
// page loads without console errors, its block map and counts agree with /metrics, a streamed
// request shows in its request list with its blocks, and a screenshot is saved.
//   KVSERVE_URL=http://127.0.0.1:PORT SCREENSHOT=out.png [CHROMIUM=/usr/bin/chromium] node test.mjs
import { chromium } from "playwright-core";

const url = process.env.KVSERVE_URL;
const prompt = "Once upon a time there was a little girl named Lily. She liked to play in the " +
  "park with her friends every day after school.";
let failures = 0;
const check = (ok, what) => {
  console.log((ok ? "ok   - " : "FAIL - ") + what);
  if (!ok) failures++;
};
async function metrics() {
  const text = await (await fetch(url + "/metrics")).text();
  const value = (name) => Number((text.match(new RegExp("^kvserve:" + name + " (\\S+)$", "m")) || [])[1]);
  return { total: value("kv_cache_blocks_total"), free: value("kv_cache_blocks_free"),
           running: value("num_requests_running"), queries: value("prefix_cache_queries_total") };
}
async function dom(page) {
  return page.evaluate(() => {
    const n = (id) => Number(document.getElementById(id).textContent);
    return { free: n("n-free"), cached: n("n-cached"), used: n("n-used"), shared: n("n-shared"),
             running: document.querySelectorAll("#requests tr.request").length,
             rows: [...document.querySelectorAll("#requests tr.request")].map(
               (tr) => [...tr.children].map((td) => td.textContent)),
             drawn: Number(document.getElementById("map").dataset.blocks || 0),
             asked: Number(document.body.dataset.asked || 0) };
  });
}
// The page's first refresh with a state asked for after now (it polls once a second; a reply in
// flight now shows an older state).
async function nextRefresh(page) {
  const since = Date.now();
  await page.waitForFunction((t) => Number(document.body.dataset.asked || 0) > t, since,
                             { timeout: 10000 });
  return dom(page);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // No background connections: this machine's network is closed to them.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url + "/dashboard");

  // One request to completion: its prompt's full blocks stay cached, nothing is in use.
  const done = await (await fetch(url + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 4 }) })).json();
  const promptTokens = done.usage.prompt_tokens;
  // The reply can reach us before the engine frees the request's blocks: wait until /metrics
  // shows the request counted and gone, then compare a page refresh asked for after that with
  // /metrics read again (idle, so nothing changes between the two).
  let m = await metrics();
  for (let i = 0; i < 200 && (m.queries < promptTokens || m.running !== 0); i++) m = await metrics();
  let d = await nextRefresh(page);
  m = await metrics();
  check(d.drawn === m.total, `block map draws every block (${d.drawn} of ${m.total})`);
  check(d.free + d.cached === m.free && d.used + d.shared === m.total - m.free,
        `idle: free ${d.free} + cached ${d.cached} = /metrics free ${m.free}, in use ${d.used + d.shared}`);
  check(d.cached === Math.floor((promptTokens - 1) / 16),
        `the prompt's ${Math.floor((promptTokens - 1) / 16)} full blocks show as cached (${d.cached})`);

  // A long streamed request, kept open: it runs, holding blocks, while the page refreshes.
  const controller = new AbortController();
  const res = await fetch(url + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, signal: controller.signal,
    body: JSON.stringify({ prompt, max_tokens: 32000, stream: true, ignore_eos: true }) });
  const reader = res.body.getReader();
  await reader.read();  // the first token: it runs
  d = await nextRefresh(page);
  m = await metrics();
  check(d.running === 1 && m.running === 1, `the running request is listed (${JSON.stringify(d.rows)})`);
  const row = d.rows[0] || [];
  check(Number(row[1]) === promptTokens && Number(row[4]) > 0,
        `its prompt (${row[1]} tokens) and blocks (${row[4]}) are shown`);
  check(d.used + d.shared >= Number(row[4]) && d.free + d.cached + d.used + d.shared === m.total,
        `in use ${d.used + d.shared} covers its blocks; every block counted once`);
  await page.screenshot({ path: process.env.SCREENSHOT || "dashboard.png", fullPage: true });
  controller.abort();
  await reader.cancel().catch(() => {});

  // Aborted: the blocks come back, and the page shows the pool as /metrics does.
  for (let i = 0; i < 200 && (m = await metrics()).running > 0; i++) await new Promise((r) => setImmediate(r));
  d = await nextRefresh(page);
  m = await metrics();
  check(d.running === 0 && d.used + d.shared === 0 && d.free + d.cached === m.free,
        `after the client left: nothing in use, free ${d.free} + cached ${d.cached} = ${m.free}`);
  check(errors.length === 0, `no console errors (${errors.join("; ")})`);
} finally {
  await browser.close();
}
console.log(`${failures === 0 ? "all passed" : failures + " failed"}`);
process.exit(failures === 0 ? 0 : 1);
