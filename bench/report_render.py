#!/usr/bin/env python3
"""Renders docs/report/README.md and its plots from one bench/report.sh run's raw data.

usage: report_render.py DATA_DIR OUT_DIR   (DATA_DIR: docs/report/data/DATE)
Every figure comes from the JSON and logs in DATA_DIR; nothing is typed in by hand. Each plot's
caption names the machine, the date, the command and the peer's version (DATA_DIR/run.txt).
"""
import glob
import json
import os
import re
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DATA, OUT = sys.argv[1], sys.argv[2]
RUN = dict(line.split(": ", 1) for line in open(os.path.join(DATA, "run.txt")).read().splitlines())
REL = os.path.relpath(DATA, OUT)
FOOT = f"{RUN['machine']}; {RUN['date']}; kvserve {RUN['kvserve']}; peer {RUN['peer']}"
sections = []


def jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []


def command(sub):
    path = os.path.join(DATA, sub, "command.txt")
    text = open(path).read().strip() if os.path.exists(path) else "?"
    return text.replace(os.path.expanduser("~"), "~")


def save(fig, name, cmd):
    width = int(fig.get_figwidth() * 22)  # characters of 6-point text across the figure
    lines = textwrap.wrap(FOOT, width) + textwrap.wrap(cmd, width)
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=6, color="#555", va="bottom")
    fig.tight_layout(rect=(0, 0.025 * len(lines) + 0.02, 1, 1))
    fig.savefig(os.path.join(OUT, name), dpi=110)
    plt.close(fig)
    return name


# 1. Prefill and decode, kvserve / llama.cpp, per model and weight type.
ours, peers = jsonl(os.path.join(DATA, "speed/ours.jsonl")), jsonl(os.path.join(DATA, "speed/peer.jsonl"))
if ours and peers:
    names, pp, tg = [], [], []
    for o, peer in zip(ours, peers):
        test = lambda r: "pp" if r["n_gen"] == 0 else "tg" if r["n_prompt"] == 0 else None  # noqa: E731
        best = {t: max((r for r in peer if test(r) == t), key=lambda r: r["avg_ts"]) for t in ("pp", "tg")}
        names.append(os.path.basename(o.get("model", best["pp"]["model_filename"]))[:-5])
        pp.append(o["pp_tps"] / best["pp"]["avg_ts"])
        tg.append(o["tg_tps"] / best["tg"]["avg_ts"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], pp, 0.4, label="prefill (pp512)")
    ax.bar([i + 0.2 for i in x], tg, 0.4, label="decode (tg128)")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("kvserve / llama.cpp (tokens/s)")
    ax.set_title("Speed against llama-bench (its better of -lm mmap, none; -fa on)")
    ax.legend()
    img = save(fig, "speed.png", command("speed"))
    rows = "\n".join(f"| {n} | {a:.2f}× | {b:.2f}× |" for n, a, b in zip(names, pp, tg))
    sections.append(("Prefill and decode", img, "| model | prefill ratio | decode ratio |\n|---|---|---|\n" + rows,
                     "speed.md"))

# 2. Throughput and latency against concurrency, both servers.
rows = jsonl(os.path.join(DATA, "serve/results.jsonl"))
if rows:
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for e in engines:
        rs = sorted((r for r in rows if r["engine"] == e), key=lambda r: r["concurrency"])
        c = [r["concurrency"] for r in rs]
        axes[0].plot(c, [r["output_tps"] for r in rs], "o-", label=e)
        axes[1].plot(c, [r["ttft_ms"]["p50"] for r in rs], "o-", label=e + " p50")
        axes[1].plot(c, [r["ttft_ms"]["p99"] for r in rs], "x--", label=e + " p99")
        axes[2].plot(c, [r["itl_ms"]["p50"] for r in rs], "o-", label=e + " p50")
        axes[2].plot(c, [r["itl_ms"]["p99"] for r in rs], "x--", label=e + " p99")
    for ax, t, y in zip(axes, ("Output throughput", "TTFT", "ITL"), ("tokens/s", "ms", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(y)
        ax.set_title(t)
        ax.legend(fontsize=6)
    img = save(fig, "serve.png", command("serve"))
    sections.append(("Serving: throughput and latency against concurrency", img, "", "serve.md"))

# 3. Prefix cache: cold against warm TTFT.
rows = [r for r in jsonl(os.path.join(DATA, "prefix/r.jsonl")) if r.get("workload") == "shared-prefix"]
if rows:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["ttft_cold_ms"] for r in rows], 0.4, label="cold (first request)")
    ax.bar([i + 0.2 for i in x], [r["ttft_ms"]["p50"] for r in rows], 0.4, label="warm p50")
    ax.set_xticks(list(x), [r["engine"] for r in rows], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT, ms")
    ax.set_title("Shared prefix: time to first token, cold and warm")
    ax.legend()
    img = save(fig, "prefix.png", command("prefix"))
    sections.append(("Prefix cache: TTFT cold and warm", img, "", "prefix.md"))


# 4. KV fidelity: bits per element against KL and ΔPPL; 5. KV capacity per type.
def peer_figures(log):
    text = open(log).read()
    num = lambda pat: (lambda m: float(m.group(1)) if m else None)(re.search(pat, text, re.M))  # noqa: E731
    q, b = num(r"^Mean PPL\(Q\)\s*:\s*([-0-9.e+]+)"), num(r"^Mean PPL\(base\)\s*:\s*([-0-9.e+]+)")
    kl = num(r"^Mean\s+KLD:\s*([-0-9.e+]+)")
    return (100 * (q / b - 1) if q and b else None), kl


PEER_BITS = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5}  # GGML's formats: bits per element
fid = {os.path.basename(p)[8:-5]: json.load(open(p)) for p in glob.glob(os.path.join(DATA, "fidelity/kvserve-*.json"))}
if fid:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for t, j in sorted(fid.items(), key=lambda kv: -kv[1]["bits_k"]):
        bits = (j["bits_k"] + j["bits_v"]) / 2
        axes[0].scatter(bits, max(j["kl_mean"], 1e-7), color="C0")
        axes[0].annotate(t, (bits, max(j["kl_mean"], 1e-7)), fontsize=7)
        axes[1].scatter(bits, j["delta_ppl_pct"], color="C0")
        axes[1].annotate(t, (bits, j["delta_ppl_pct"]), fontsize=7)
    for t, bits in PEER_BITS.items():
        log = os.path.join(DATA, f"fidelity/peer-{t}.log")
        if os.path.exists(log):
            dppl, kl = peer_figures(log)
            if kl is not None:
                axes[0].scatter(bits, max(kl, 1e-7), color="C1", marker="x")
                axes[0].annotate("llama.cpp " + t, (bits, max(kl, 1e-7)), fontsize=7, color="C1")
            if dppl is not None:
                axes[1].scatter(bits, dppl, color="C1", marker="x")
                axes[1].annotate("llama.cpp " + t, (bits, dppl), fontsize=7, color="C1")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("mean KL vs f32 cache")
    axes[1].set_ylabel("ΔPPL vs f32 cache, %")
    for ax in axes:
        ax.set_xlabel("bits per element (K and V mean)")
    fig.suptitle("KV cache fidelity, stories-hd64-3M, -c 256 (kvserve: dots; llama.cpp: crosses)")
    img = save(fig, "fidelity.png", command("fidelity"))
    rows = "\n".join(f"| {t} | {(j['bits_k'] + j['bits_v']) / 2:.2f} | {j['delta_ppl_pct']:+.3f}% | {j['kl_mean']:.2e} |"
                     f" {j['top1_agree_pct']:.1f}% |" for t, j in sorted(fid.items(), key=lambda kv: -kv[1]["bits_k"]))
    sections.append(("KV fidelity: bits per element against KL and ΔPPL", img,
                     "| kvserve type | bits/el | ΔPPL | KL | top-1 |\n|---|---|---|---|---|\n" + rows, None))
    # Capacity: tokens a GiB of KV holds for llama-1b's geometry (16 layers, 8 KV heads, 64 dims).
    per_token_el = 16 * 8 * 64 * 2
    fig, ax = plt.subplots(figsize=(8, 3.6))
    types = sorted(fid.items(), key=lambda kv: -kv[1]["bits_k"])
    ax.bar([t for t, _ in types], [2**30 * 8 / (per_token_el * (j["bits_k"] + j["bits_v"]) / 2) / 1000 for _, j in types],
           label="kvserve")
    ax.bar(["llama.cpp " + t for t in PEER_BITS], [2**30 * 8 / (per_token_el * b) / 1000 for b in PEER_BITS.values()],
           color="C1", label="llama.cpp")
    ax.set_ylabel("thousand tokens per GiB")
    ax.set_title("KV capacity per type (llama-1b geometry; bits per element as measured above)")
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    ax.legend()
    img = save(fig, "capacity.png", command("fidelity"))
    sections.append(("KV capacity per type", img, "", None))

# 6. The cold tiers' codecs: ratio against KL.
cb = os.path.join(DATA, "codec/stories-hd64-3M.json")
if os.path.exists(cb):
    j = json.load(open(cb))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for c in j["codecs"]:
        color = "C2" if c["name"].startswith("tc") else "C0"
        ax.scatter(c["ratio_vs_f16"], max(c["kl_mean"], 1e-8), color=color)
        ax.annotate(c["name"], (c["ratio_vs_f16"], max(c["kl_mean"], 1e-8)), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("size ratio vs f16")
    ax.set_ylabel("mean KL vs f32 cache")
    ax.set_title("Cold-tier codecs: smaller against closer (stories-hd64-3M, -c 256)")
    img = save(fig, "codecs.png", command("codec"))
    rows = "\n".join(f"| {c['name']} | {c['ratio_vs_f16']:.2f}× | {c['delta_ppl_pct']:+.3f}% | {c['kl_mean']:.2e} |"
                     f" {c['decode_mb_s']:.0f} |" for c in j["codecs"])
    sections.append(("Cold-tier codecs", img, "| codec | ratio vs f16 | ΔPPL | KL | decode MB/s |\n|---|---|---|---|---|\n"
                     + rows, None))

with open(os.path.join(OUT, "README.md"), "w") as f:
    f.write("# kvserve against llama.cpp: the report\n\n")
    f.write("Generated by `bash bench/report.sh" + (" --quick" if RUN["quick"] == "1" else "") +
            "` from the data of one run, kept in [" + REL + "](" + REL + "); do not edit by hand.\n\n")
    f.write(f"- date: {RUN['date']}\n- machine: {RUN['machine']}\n- kvserve: {RUN['kvserve']}\n"
            f"- peer: {RUN['peer']} (flash attention on, both load modes where it has them)\n\n")
    for title, img, table, md in sections:
        f.write(f"## {title}\n\n![{title}]({img})\n\n")
        if table:
            f.write(table + "\n\n")
        if md and os.path.exists(os.path.join(DATA, md)):
            f.write(f"Full table: [{md}]({REL}/{md}).\n\n")
print(f"rendered {len(sections)} sections into {OUT}/README.md", file=sys.stderr)
