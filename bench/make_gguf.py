"""Writes a random-weight GGUF of a real model's shape (the architectures kvserve adds after the
shared make_synth_gguf.py's dense ones), in F16, with a real vocabulary copied from another GGUF.
The weights are random, so outputs are gibberish, but shapes, metadata and tokenizer are real:
speed, memory and logits compare with llama.cpp's on the same file.

usage: PYTHONPATH=<llama.cpp>/gguf-py python3 make_gguf.py PRESET OUT.gguf --vocab-from GGUF [--seed N]
presets: gemma3-1b, gemma3-4b
"""
import argparse

import numpy as np
from gguf import GGUFReader, GGUFWriter

# name: n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, window, global rope base, linear factor
GEMMA3 = {
    "gemma3-1b": (1152, 26, 4, 1, 256, 6912, 512, 1_000_000.0, 1.0),
    "gemma3-4b": (2560, 34, 8, 4, 256, 10240, 1024, 1_000_000.0, 8.0),
}

# Gemma 3's chat format (the turn markers of the peer's google-gemma-2-2b-it.jinja; the system
# message, which Gemma 2 refuses, opens the first user turn).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + "
    "message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def copy_vocab(w, vocab_from):
    r = GGUFReader(vocab_from)
    field = lambda k: r.fields[k].contents()
    toks = field("tokenizer.ggml.tokens")
    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_token_list(toks)
    if "tokenizer.ggml.scores" in r.fields:
        w.add_token_scores(field("tokenizer.ggml.scores"))
    w.add_token_types(field("tokenizer.ggml.token_type"))
    for key, fn in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                    ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                    ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id)):
        if key in r.fields:
            fn(int(field(key)))
    return len(toks)


def write_gemma3(preset, out, vocab_from, seed):
    d, L, H, Hkv, hd, ff, window, base, factor = GEMMA3[preset]
    rng = np.random.default_rng(seed)

    def W(rows, cols, gain=1.0):  # ggml order: ne0 = cols (the input dimension)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (gain / np.sqrt(cols))).astype(np.float16)

    def norm(n, noise=0.1):  # stored as 1 + w, as the converter writes Gemma's norms
        return (1.0 + noise * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w = GGUFWriter(out, "gemma3")
    w.add_name(f"synthetic-{preset}")
    w.add_context_length(32768)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(base)
    if factor != 1.0:
        w.add_string("gemma3.rope.scaling.type", "linear")
        w.add_float32("gemma3.rope.scaling.factor", factor)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32("gemma3.attention.sliding_window", window)
    V = copy_vocab(w, vocab_from)
    w.add_chat_template(GEMMA3_TEMPLATE)

    # The tied output reads the embedding: logits with a standard deviation of about 1.5.
    w.add_tensor("token_embd.weight", (1.5 / np.sqrt(d) * rng.standard_normal((V, d), dtype=np.float32)).astype(np.float16))
    w.add_tensor("output_norm.weight", norm(d))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(d))
        w.add_tensor(p + "attn_q.weight", W(H * hd, d))
        w.add_tensor(p + "attn_k.weight", W(Hkv * hd, d))
        w.add_tensor(p + "attn_v.weight", W(Hkv * hd, d))
        w.add_tensor(p + "attn_output.weight", W(d, H * hd, gain=0.5))
        # A few channels of large gain in both per-head norms, as trained Q/K norms have: scores
        # spread (a standard deviation near 2), so attention picks keys and the window matters.
        qn, kn = norm(hd), norm(hd)
        loud = rng.choice(hd, size=8, replace=False)
        qn[loud] *= 3.0
        kn[loud] *= 3.0
        w.add_tensor(p + "attn_q_norm.weight", qn)
        w.add_tensor(p + "attn_k_norm.weight", kn)
        w.add_tensor(p + "post_attention_norm.weight", norm(d))
        w.add_tensor(p + "ffn_norm.weight", norm(d))
        w.add_tensor(p + "ffn_gate.weight", W(ff, d))
        w.add_tensor(p + "ffn_up.weight", W(ff, d))
        w.add_tensor(p + "ffn_down.weight", W(d, ff, gain=0.5))
        w.add_tensor(p + "post_ffw_norm.weight", norm(d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}: {preset} (gemma3), vocab {V}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset", choices=sorted(GEMMA3))
    ap.add_argument("out")
    ap.add_argument("--vocab-from", required=True, help="GGUF whose tokenizer to copy")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write_gemma3(a.preset, a.out, a.vocab_from, a.seed)


if __name__ == "__main__":
    main()
