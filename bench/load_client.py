#!/usr/bin/env python3
"""Closed-loop load generator for an HTTP completion server (standard library only).

Sends REQUESTS completion requests, at most CONCURRENCY in flight, each with its own
random prompt of PROMPT_TOKENS token ids (fixed seed, so runs are repeatable) and a
fixed generation length (ignore_eos, greedy, no prompt cache), then prints one JSON line:

  wall_s       first request sent -> last response received
  output_tps   generated tokens (as reported by the server) / wall_s
  total_tps    (prompt tokens sent + generated tokens) / wall_s
  ttft_ms      mean server-side prompt time per request (llama.cpp timings.prompt_ms);
               it includes decode steps of other requests batched with the prompt
  tpot_ms      mean server-side time per generated token (timings.predicted_ms / predicted_n)
  latency_ms   mean client-side request latency
  short        requests that generated fewer tokens than asked

APIs:
  llama   llama-server's native POST /completion: "n_predict", answer carries "timings"
  openai  OpenAI-style POST /v1/completions: "max_tokens", answer carries "usage"
          (llama-server also adds "timings" there; ttft/tpot are null without them)
--api auto picks openai when the endpoint contains /v1/, llama otherwise.
Prompt ids are drawn from [--vocab-lo, --vocab-hi), the upper end lowered to the vocabulary
size when GET /v1/models reports one (llama-server: data[0].meta.n_vocab).
Only the llama path has been exercised so far.

  usage: load_client.py --url http://127.0.0.1:8080 --concurrency 4 [--requests 8]
                        [--prompt-tokens 128] [--gen-tokens 128] [--endpoint /completion]
"""
import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--endpoint", default="/completion", help="path of the completion endpoint")
    p.add_argument("--api", choices=["auto", "llama", "openai"], default="auto")
    p.add_argument("--model", default=None, help='"model" field for the openai API')
    p.add_argument("-c", "--concurrency", type=int, required=True, help="max requests in flight")
    p.add_argument("-n", "--requests", type=int, default=None, help="number of requests (default: concurrency)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--vocab-lo", type=int, default=10, help="prompt token ids are drawn from [lo, hi)")
    p.add_argument("--vocab-hi", type=int, default=1000, help="lowered to n_vocab when /v1/models reports it")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--warmup", type=int, default=0, help="untimed requests sent one by one before the run")
    p.add_argument("--timeout", type=float, default=600, help="per-request timeout, seconds")
    p.add_argument("--engine", default="llama.cpp", help='"engine" field of the output')
    p.add_argument("--tool", default="llama-server", help='"tool" field of the output')
    p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra string field of the output (repeatable)")
    a = p.parse_args()
    if a.requests is None:
        a.requests = a.concurrency
    if a.concurrency < 1 or a.requests < 1 or a.prompt_tokens < 1 or a.gen_tokens < 1:
        p.error("concurrency, requests, prompt-tokens and gen-tokens must be positive")
    if not 0 <= a.vocab_lo < a.vocab_hi:
        p.error("need 0 <= vocab-lo < vocab-hi")
    if any("=" not in f for f in a.field):
        p.error("--field takes KEY=VALUE")
    if a.api == "auto":
        a.api = "openai" if "/v1/" in a.endpoint else "llama"
    return a


def make_payload(a, prompt):
    body = {"prompt": prompt, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    if a.api == "openai":
        body["max_tokens"] = a.gen_tokens
        if a.model:
            body["model"] = a.model
    else:
        body["n_predict"] = a.gen_tokens
    return json.dumps(body).encode()


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy


def post(a, payload):
    req = urllib.request.Request(a.url.rstrip("/") + a.endpoint, data=payload,
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    try:
        with _opener.open(req, timeout=a.timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError("HTTP %d: %s" % (e.code, e.read()[:300].decode(errors="replace"))) from None
    return json.loads(body), (time.perf_counter() - t0) * 1000.0


def measure(a, resp, latency_ms):
    """Generated tokens, prompt ms and decode ms of one answer (ms are None when not reported)."""
    t = resp.get("timings") or {}
    if "predicted_n" in t:
        n_gen = int(t["predicted_n"])
    elif a.api == "openai" and "usage" in resp:
        n_gen = int(resp["usage"]["completion_tokens"])
    elif "tokens_predicted" in resp:
        n_gen = int(resp["tokens_predicted"])
    else:
        raise RuntimeError("no generated-token count in answer: %s" % json.dumps(resp)[:300])
    return dict(n_gen=n_gen, prompt_ms=t.get("prompt_ms"), predicted_ms=t.get("predicted_ms"),
                prompt_n=t.get("prompt_n"), latency_ms=latency_ms)


def mean(xs):
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 2) if xs else None


def server_vocab(a):
    """n_vocab from GET /v1/models (llama-server puts it in data[].meta), or None."""
    try:
        with _opener.open(a.url.rstrip("/") + "/v1/models", timeout=10) as r:
            return int(json.loads(r.read())["data"][0]["meta"]["n_vocab"])
    except Exception:
        return None


def main():
    a = parse_args()
    n_vocab = server_vocab(a)
    if n_vocab is not None and n_vocab < a.vocab_hi:  # a server rejects ids past its vocabulary
        print("load_client.py: note: vocabulary has %d tokens, drawing prompt ids from [%d, %d)"
              % (n_vocab, a.vocab_lo, n_vocab), file=sys.stderr)
        a.vocab_hi = n_vocab
        if a.vocab_lo >= a.vocab_hi:
            sys.exit("load_client.py: vocab-lo %d is past the vocabulary" % a.vocab_lo)
    rng = random.Random(a.seed)
    prompts = [[rng.randrange(a.vocab_lo, a.vocab_hi) for _ in range(a.prompt_tokens)] for _ in range(a.requests)]
    payloads = [make_payload(a, p) for p in prompts]

    for i in range(a.warmup):
        wrng = random.Random(a.seed + 1 + i)
        post(a, make_payload(a, [wrng.randrange(a.vocab_lo, a.vocab_hi) for _ in range(a.prompt_tokens)]))

    lock = threading.Lock()
    errors = []

    def one(i):
        try:
            resp, lat = post(a, payloads[i])
            return measure(a, resp, lat)
        except Exception as e:  # report all failures, not only the first
            with lock:
                errors.append("request %d: %s" % (i, e))
            return None

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=a.concurrency) as ex:
        results = list(ex.map(one, range(a.requests)))
    wall = time.perf_counter() - t0

    if errors:
        for e in errors[:10]:
            print("load_client.py: " + e, file=sys.stderr)
        sys.exit("load_client.py: %d of %d requests failed" % (len(errors), a.requests))

    n_gen = sum(r["n_gen"] for r in results)
    n_prompt = a.prompt_tokens * a.requests
    short = sum(1 for r in results if r["n_gen"] < a.gen_tokens)
    if short:
        print("load_client.py: warning: %d requests generated fewer than %d tokens" % (short, a.gen_tokens),
              file=sys.stderr)
    print(json.dumps({
        "engine": a.engine, "tool": a.tool, "np": a.concurrency, "requests": a.requests,
        "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "generated_total": n_gen,
        "wall_s": round(wall, 3),
        "output_tps": round(n_gen / wall, 2),
        "total_tps": round((n_prompt + n_gen) / wall, 2),
        "ttft_ms": mean([r["prompt_ms"] for r in results]),
        "tpot_ms": mean([r["predicted_ms"] / r["n_gen"] if r["predicted_ms"] is not None and r["n_gen"] else None
                         for r in results]),
        "latency_ms": mean([r["latency_ms"] for r in results]),
        "short": short,
        **dict(f.split("=", 1) for f in a.field),
    }))


if __name__ == "__main__":
    main()
