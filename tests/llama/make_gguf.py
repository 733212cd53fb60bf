"""Write tiny llama-architecture GGUF models that need no download.

Two kinds:
  --kind random : every weight random (std 0.02); text is gibberish.
  --kind chain  : every block weight random but tiny (std --noise), embeddings one-hot and the
                  output matrix set so that the next token depends only on the current one:
                  after any prompt token it writes "The quick brown fox jumps over the lazy dog."
                  and then either loops forever (--end loop) or emits </s> (--end eos);
                  --end tool writes a Hermes-style <tool_call>, --end think a leading
                  "<think> Checking weather first.</think>" before the sentence, --end
                  think-tool that think block before the tool call.
                  Readable, deterministic text makes stop sequences and max_tokens checkable.
Speed is set with --layers / --hidden / --ff (compute per token grows with layers*hidden*ff).
"""

from __future__ import annotations

import argparse
import string

import gguf
import numpy as np

CHATML_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHATML_THINKING = CHATML_TOOLS.replace(
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}",
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>' + message.reasoning_content + '</think>' }}{%- endif %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}",
)
"""The same template, rendering an assistant message's `reasoning_content` in a leading think
block (as Qwen3's and DeepSeek-R1's templates do), so llama.cpp knows the model reasons."""
THINK_SEQ = ["<think>", "\u2581Checking", "\u2581weather", "\u2581first.", "</think>"]
TOOL_SEQ = ["<tool_call>\n", '{"name":"get_weather",', '"arguments":{"city":"Paris"}}', "\n</tool_call>"]
SENTENCE = ["\u2581The", "\u2581quick", "\u2581brown", "\u2581fox", "\u2581jumps", "\u2581over",
            "\u2581the", "\u2581lazy", "\u2581dog", "."]


def vocab() -> tuple[list[str], list[float], list[int]]:
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
    for piece in ["<|im_start|>", "<|im_end|>"]:
        tokens.append(piece)
        types.append(gguf.TokenType.CONTROL)
    chars = [c for c in string.printable if c not in " \t\n\r\x0b\x0c"] + ["\u2581"]
    words = [w for w in SENTENCE if w not in chars] + TOOL_SEQ + THINK_SEQ
    for piece in chars + words:
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
    scores = [0.0] * len(tokens)
    for i, t in enumerate(tokens):
        if types[i] == gguf.TokenType.NORMAL:
            scores[i] = -float(len(t))  # unused merges; any value is valid
    return tokens, scores, [int(t) for t in types]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kind", choices=["random", "chain"], default="chain")
    ap.add_argument("--end", choices=["loop", "eos", "tool", "think", "think-tool"],
                    default="loop")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--noise", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    tokens, scores, types = vocab()
    n_vocab = len(tokens)
    d, ff, L = a.hidden, a.ff, a.layers
    rng = np.random.default_rng(a.seed)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"tiny-{a.kind}-{a.end}-{L}x{d}")
    w.add_context_length(a.ctx)
    w.add_embedding_length(d)
    w.add_block_count(L)
    w.add_feed_forward_length(ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.heads)
    w.add_rope_dimension_count(d // a.heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_THINKING if a.end.startswith("think") else CHATML_TOOLS)

    def rand(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    if a.kind == "random":
        std = 0.02
        emb = rand(n_vocab, d, std=1.0).astype(np.float32)
        out = rand(n_vocab, d, std=std)
    else:
        if d < n_vocab:
            raise SystemExit(f"chain needs hidden >= vocab ({n_vocab})")
        std = a.noise
        emb = np.zeros((n_vocab, d), dtype=np.float32)
        emb[np.arange(n_vocab), np.arange(n_vocab)] = 1.0
        index = {t: i for i, t in enumerate(tokens)}
        seq = [index[t] for t in SENTENCE]
        tseq = [index[t] for t in TOOL_SEQ]
        kseq = [index[t] for t in THINK_SEQ]
        answer = tseq if a.end in ("tool", "think-tool") else seq
        start = kseq[0] if a.end in ("think", "think-tool") else answer[0]
        nxt = np.full(n_vocab, start)  # after any prompt token
        for i, t in enumerate(seq[:-1]):
            nxt[t] = seq[i + 1]
        nxt[seq[-1]] = seq[0] if a.end == "loop" else 2
        if answer is tseq:
            for x, y in zip(tseq, tseq[1:] + [2]):
                nxt[x] = y
        if start == kseq[0]:
            for x, y in zip(kseq, kseq[1:] + [answer[0]]):
                nxt[x] = y
        out = np.zeros((n_vocab, d), dtype=np.float32)
        for cur in range(n_vocab):
            out[nxt[cur], cur] = 1.0  # logit of next(cur) = sqrt(d) after RMSNorm; others ~0
        out = out.astype(np.float16)

    w.add_tensor("token_embd.weight", emb.astype(np.float16))
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(d, d, std=std))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(d, d, std=std))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(d, d, std=std))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(d, d, std=std))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(ff, d, std=std))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(ff, d, std=std))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(d, ff, std=std))
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: vocab {n_vocab}, {L} layers, hidden {d}, ff {ff}")


if __name__ == "__main__":
    main()
