"""Train a small local HF tokenizer (byte-level BPE, vocab 8192) for GuideLLM/AIPerf runs offline.

Both tools need a Hugging Face tokenizer and there is no hub access here. Trained on the CPython
standard library sources; the synthetic server's token text " the" encodes as exactly one token,
so client-side token counts equal the server's. Run with a venv that has ``tokenizers`` (e.g. the
GuideLLM side venv): ``/work/bench-venvs/guidellm/bin/python benchmarks/make_tokenizer.py OUTDIR``.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path


def main(out: str) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))[:400]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    assert len(tok.encode(" the").ids) == 1, "' the' must be one token"
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
    (dest / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (dest / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 8192,
                                                    "bos_token_id": 0, "eos_token_id": 0}))
    print(f"tokenizer written to {dest} (' the' -> {tok.encode(' the').ids})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/.work/tokenizer"))
